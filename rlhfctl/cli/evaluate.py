"""``rlhfctl eval``: score a trained policy on validation prompts with the recipe's reward, as training validates."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.table import Table

from rlhfctl.cli.console import OutputFormat, OverridesArg, make_console, print_line, refuse_missing_paths, show_library_output
from rlhfctl.cli.errors import guarded

if TYPE_CHECKING:  # only for annotations
    from rich.console import Console

    from rlhfctl.evaluation.evaluate import Evaluation

__all__ = ["evaluate_command", "render_evaluation"]


def evaluate_command(
    target: str = typer.Argument(..., show_default=False,
                                 help="a run directory (its newest checkpoint), a checkpoints/step_N directory, a Hugging "
                                      "Face model directory (a run's model/ export) or a hub id"),
    overrides: Optional[List[str]] = OverridesArg(),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="the recipe that builds and rewards the policy (default: "
                                                                 "the run's own recipe.yaml)"),
    data: Optional[Path] = typer.Option(None, "--data", help="prompts to score (jsonl, json or parquet; default: "
                                                             "data.val_files or the recipe's task)"),
    n: Optional[int] = typer.Option(None, "--n", min=1, help="responses per prompt (default rollout.val_n: 1, greedy; "
                                                             "more are sampled and give pass@k)"),
    output_format: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table for people, json for tools"),
    samples: Optional[Path] = typer.Option(None, "--samples", help="write every scored response here (jsonl)"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show every library's own output"),
) -> None:
    """Score a trained policy on validation prompts with the recipe's reward.

    The responses and scores come from the code training validates with, on the recipe's pools (or
    ray.backend=local): for a run's checkpoint, with the run's seed, the numbers equal the val/* metrics
    the run logged at that step. Reports mean@n and, when the reward returns an acc, pass@k, per
    data_source, with 95% intervals over prompts.

    Examples:

      rlhfctl eval runs/quickstart

      rlhfctl eval runs/quickstart/checkpoints/step_20 --n 8 --format json

      rlhfctl eval runs/gsm8k/model --data test.parquet --samples scored.jsonl

      rlhfctl eval Qwen/Qwen2.5-0.5B-Instruct --recipe grpo-gsm8k ray.backend=local
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        from rlhfctl.evaluation.policy_groups import inference_config
        from rlhfctl.evaluation.policy_source import find_policy

        source = find_policy(target, recipe)
        cfg = inference_config(source, overrides or [], ("actor", "reward"), [str(data)] if data is not None else ())
        refuse_missing_paths(cfg, err)
        show_library_output(verbose)
        from rlhfctl.evaluation.evaluate import evaluate  # torch: once the inputs are checked
        from rlhfctl.recipe.resolved import resolve

        progress = None if output_format is OutputFormat.json else _progress_line(err)
        result = evaluate(resolve(cfg), source, n, progress)
        if samples is not None:
            from rlhfctl.evaluation.records import write_records

            write_records(samples, result.samples)
        if output_format is OutputFormat.json:
            typer.echo(json.dumps(result.to_json(), indent=2, sort_keys=True))
        else:
            render_evaluation(console, result)
            if samples is not None:
                print_line(console, f"samples: {samples}")


def _progress_line(err: Console) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        print_line(err, f"eval: {done}/{total} prompts scored", "dim")

    return report


def render_evaluation(console: Console, result: Evaluation) -> None:
    """The report as a table: one row per data source (all first), mean@n and pass@k with their 95% intervals."""
    table = Table(title=f"eval of {result.policy} (step {result.step}, n={result.n})")
    ks = [key for key in result.report["all"] if key.startswith("pass@") and not key.endswith("_ci95")]
    for column in ("source", "prompts", "samples", f"mean@{result.n}", *ks):
        table.add_column(column, justify="left" if column == "source" else "right")
    for source, entry in result.report.items():
        cells = [source, str(entry["prompts"]), str(entry["samples"]), _with_interval(entry, "mean")]
        table.add_row(*cells, *(_with_interval(entry, key) for key in ks))
    console.print(table)
    print_line(console, "as training logs it: " + ", ".join(f"{key} {value:.4g}" for key, value in sorted(result.val_metrics.items())))


def _with_interval(entry: dict, key: str) -> str:
    return f"{entry[key]:.4f} ± {entry[key + '_ci95']:.4f}"
