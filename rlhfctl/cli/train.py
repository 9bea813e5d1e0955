"""``rlhfctl train``: load and validate a recipe, show its essentials, run the trainer with a reporter."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import typer
from rich.console import Console

from rlhfctl.cli.console import make_console, print_error
from rlhfctl.cli.errors import EXIT_INTERNAL, EXIT_USER, guarded
from rlhfctl.cli.options import OverridesArg, RecipeArg

__all__ = ["train"]

_TRAINER_MODULE = "rlhfctl.trainer"


def train(
    recipe: str = RecipeArg(),
    overrides: Optional[List[str]] = OverridesArg(),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print nothing but errors"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="with plain (non-terminal) output, also log every group call"),
) -> None:
    """Train a policy as RECIPE says.

    The recipe is loaded with the overrides and validated first (exit 2 on a problem, naming the key);
    then Ray starts (or is joined) and training runs with a live progress view on a terminal, or one
    line per step otherwise.

    Examples:

      rlhfctl train recipes/quickstart.yaml

      rlhfctl train quickstart trainer.total_steps=10 rollout.n=8

      rlhfctl train my.yaml ~roles.reference data.train_files=[a.jsonl,b.jsonl] --quiet

    Exit codes: 0 done, 1 internal error, 2 recipe/data/model error, 130 interrupted.
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        from rlhfctl.cli.essentials import render_essentials
        from rlhfctl.cli.recipe_args import load_for_command
        from rlhfctl.cli.render_validation import render_issues
        from rlhfctl.recipe.validate import validate_recipe

        cfg, path = load_for_command(recipe, overrides)
        report = validate_recipe(cfg)
        if not report.ok:
            render_issues(err, report)
            raise typer.Exit(EXIT_USER)
        if not quiet:
            render_essentials(console, cfg, path, report)
            render_issues(console, report)
        run_training = _import_trainer(err)
        from rlhfctl.cli.progress import make_reporter

        with make_reporter(quiet, console, verbose=verbose, err_console=err) as reporter:
            run_training(cfg, reporter)


def _import_trainer(err: Console) -> Callable[..., Any]:
    """``rlhfctl.trainer.run_training``, or a clear message and exit 1 when it cannot be imported."""
    try:
        from rlhfctl.trainer import run_training
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing and _TRAINER_MODULE.startswith(missing):
            print_error(err, f"the trainer ({_TRAINER_MODULE}) is not part of this installation; reinstall rlhfctl")
        else:
            print_error(err, f"the trainer needs the Python module {missing!r}, which is not installed ({error})")
        raise typer.Exit(EXIT_INTERNAL) from None
    return run_training
