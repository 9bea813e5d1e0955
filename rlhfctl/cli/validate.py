"""``rlhfctl validate``: check a recipe without starting anything and show its derived batch table."""

from __future__ import annotations

import json
from typing import List, Optional

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
) -> None:
    """Check a recipe without starting anything, and show its batch-size table.

    Checks keys and types, worker classes and their registered methods, the reward function, data
    files, pools, what the algorithm needs, and the batch-size arithmetic (per-rank shards with
    padding, mini-batches, micro-batches and gradient accumulation). No weights are loaded.
    Exits 2 when there is an error.

    Examples:

      rlhfctl validate recipes/quickstart.yaml

      rlhfctl validate quickstart resource_pools.main.process_on_nodes=[3]

      rlhfctl validate my.yaml --format json
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        from rlhfctl.cli.recipe_args import load_for_command
        from rlhfctl.cli.render_validation import render_report
        from rlhfctl.recipe.validate import validate_recipe

        cfg, path = load_for_command(recipe, overrides)
        report = validate_recipe(cfg, batch_size=batch_size)
        if output_format is OutputFormat.json:
            console.file.write(json.dumps({"recipe": str(path), **report.to_dict()}, indent=2) + "\n")
        else:
            print_line(console, f"recipe: {path}", "bold")
            render_report(console, report, errors_console=err)
        if not report.ok:
            raise typer.Exit(EXIT_USER)
