"""``rlhfctl validate``: check a recipe without starting anything and show its derived batch table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional

import typer

from rlhfctl.cli.console import make_console, print_line
from rlhfctl.cli.errors import EXIT_USER, guarded
from rlhfctl.cli.options import OutputFormat, OverridesArg, RecipeArg

__all__ = ["validate"]


def validate(
    recipe: str = RecipeArg(),
    overrides: Optional[List[str]] = OverridesArg(),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="prompts per step for the table (default trainer.batch_size)"),
    output_format: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table for people, json for tools"),
    device_memory: Optional[str] = typer.Option(None, "--device-memory", help="memory of one device (e.g. 80GiB) to compare the memory plan with (default: CUDA's, when visible)"),
) -> None:
    """Check a recipe without starting anything, and show its batch-size table.

    Checks keys and types, worker classes and their registered methods, the reward function, data
    files, pools, what the algorithm needs, and the batch-size arithmetic (per-rank shards with
    padding, mini-batches, micro-batches and gradient accumulation), and shows the memory plan: each
    role's parameter, gradient, optimizer-state and KV-cache bytes per rank. No weights are loaded.
    A pipeline file (top-level `stages:`) gets every stage's recipe checked the way `rlhfctl pipeline`
    checks them before it runs; overrides are then `output_dir=DIR` or `STAGE.KEY=value`.
    Exits 2 when there is an error.

    Examples:

      rlhfctl validate recipes/quickstart.yaml

      rlhfctl validate quickstart resource_pools.main.process_on_nodes=[3]

      rlhfctl validate my.yaml --format json
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        from rlhfctl.cli.recipe_args import load_for_command, resolve_recipe_path
        from rlhfctl.cli.render_validation import render_report
        from rlhfctl.pipeline.load import is_pipeline_file
        from rlhfctl.recipe.validate import validate_recipe

        path = resolve_recipe_path(recipe)
        if is_pipeline_file(path):
            _validate_pipeline(path, overrides, output_format, console, err)
            return
        cfg, path = load_for_command(recipe, overrides)
        report = validate_recipe(cfg, batch_size=batch_size, device_memory=_device_bytes(device_memory))
        if output_format is OutputFormat.json:
            console.file.write(json.dumps({"recipe": str(path), **report.to_dict()}, indent=2) + "\n")
        else:
            print_line(console, f"recipe: {path}", "bold")
            render_report(console, report, errors_console=err)
        if not report.ok:
            raise typer.Exit(EXIT_USER)


def _device_bytes(text: Optional[str]) -> Optional[int]:
    """--device-memory as bytes; a bad size is a usage error (exit 2) naming the option."""
    if text is None:
        return None
    from rlhfctl.recipe.memory_plan import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as problem:
        raise typer.BadParameter(str(problem), param_hint="--device-memory") from None


def _validate_pipeline(path: Path, overrides: Optional[List[str]], output_format: OutputFormat, console: Any,
                       err: Any) -> None:
    """Load and check every stage of a pipeline file (PipelineError, exit 2, names the stage and key)."""
    from rlhfctl.pipeline import load_pipeline
    from rlhfctl.pipeline.observer import PipelineObserver
    from rlhfctl.pipeline.runner import plan_stages

    warnings: list[str] = []

    class _Warnings(PipelineObserver):
        def message(self, text: str, level: str = "info") -> None:
            warnings.append(text)

    spec = load_pipeline(path, list(overrides or []))
    plans = plan_stages(spec, _Warnings())
    stages = [{"name": plan.name, "algorithm": plan.algorithm, "recipe": plan.recipe, "output_dir": str(plan.directory)}
              for plan in plans]
    if output_format is OutputFormat.json:
        report = {"pipeline": str(path), "ok": True, "output_dir": str(spec.output_dir), "stages": stages,
                  "warnings": warnings}
        console.file.write(json.dumps(report, indent=2) + "\n")
        return
    print_line(console, f"pipeline: {path} (output_dir {spec.output_dir})", "bold")
    for stage in stages:
        print_line(console, f"  stage {stage['name']}: {stage['algorithm']}, {stage['recipe']} -> {stage['output_dir']}")
    for text in warnings:
        print_line(err, f"warning: {text}", "yellow")
    print_line(console, f"ok: {len(stages)} stages; outputs of earlier stages are checked again when each stage runs",
               "green")
