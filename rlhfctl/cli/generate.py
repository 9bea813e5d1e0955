"""``rlhfctl generate``: batch generation from a trained policy to jsonl or parquet."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rlhfctl.cli.console import OverridesArg, make_console, print_line, refuse_missing_paths, show_library_output
from rlhfctl.cli.errors import guarded

__all__ = ["generate_command"]


def generate_command(
    target: str = typer.Argument(..., show_default=False,
                                 help="a run directory (its newest checkpoint), a checkpoints/step_N directory, a Hugging "
                                      "Face model directory or a hub id"),
    overrides: Optional[List[str]] = OverridesArg(),
    data: Path = typer.Option(..., "--data", help="the prompts (jsonl, json or parquet; the column data.prompt_key)"),
    output: Path = typer.Option(..., "--output", "-o", help="where the records go: .jsonl or .parquet"),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="the recipe that builds the policy (default: the run's "
                                                                 "own recipe.yaml)"),
    n: int = typer.Option(1, "--n", min=1, help="responses per prompt"),
    greedy: bool = typer.Option(False, "--greedy", help="greedy decoding (default: the recipe's rollout sampling)"),
    log_probs: bool = typer.Option(False, "--log-probs", help="add each response token's log-prob under the policy"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print nothing but errors"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show every library's own output"),
) -> None:
    """Generate responses to a file of prompts with a trained policy.

    Prompts are rendered as training renders them (data.prompt_key, the chat template with
    data.apply_chat_template, the tools of rollout.multi_turn); sampling follows the recipe's rollout
    settings (override them: rollout.temperature=0.7 rollout.max_new_tokens=256). Each output row holds
    the prompt, the response, their token counts and the prompt record's other columns.

    Examples:

      rlhfctl generate runs/quickstart --data prompts.jsonl --output out.jsonl --greedy

      rlhfctl generate runs/gsm8k/model --data test.parquet --output out.parquet --n 4 --log-probs
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        from rlhfctl.evaluation.policy_groups import inference_config
        from rlhfctl.evaluation.policy_source import find_policy
        from rlhfctl.evaluation.records import record_format

        record_format(output)  # a wrong suffix fails before anything loads
        source = find_policy(target, recipe)
        cfg = inference_config(source, overrides or [], ("actor",), [str(data)])
        refuse_missing_paths(cfg, err)
        show_library_output(verbose)
        from rlhfctl.evaluation.generate import generate_records  # torch: once the inputs are checked
        from rlhfctl.evaluation.records import write_records
        from rlhfctl.recipe.resolved import resolve

        def progress(done: int, total: int) -> None:
            if not quiet:
                print_line(err, f"generate: {done}/{total} prompts", "dim")

        records = generate_records(resolve(cfg), source, n=n, greedy=greedy, log_probs=log_probs, progress=progress)
        path = write_records(output, records)
        if not quiet:
            print_line(console, f"wrote {len(records)} responses to {path}")
