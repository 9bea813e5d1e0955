"""``rlhfctl train``: load and validate a recipe, show its essentials, run the trainer with a reporter."""

from __future__ import annotations

from typing import List, Optional

import typer

from rlhfctl.cli.console import OverridesArg, RecipeArg, load_for_command, make_console, refuse_missing_paths, show_library_output
from rlhfctl.cli.errors import EXIT_USER, guarded
from rlhfctl.cli.reporters import make_reporter
from rlhfctl.cli.validate import render_issues
from rlhfctl.trainer.output_dir import check_output_dir

__all__ = ["train"]


def train(
    recipe: str = RecipeArg(),
    overrides: Optional[List[str]] = OverridesArg(),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print nothing but errors"),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="show every library's own output (progress bars, warnings) and, with plain "
                                      "(non-terminal) output, log every group call"),
) -> None:
    """Train a policy as RECIPE says.

    The recipe is loaded with the overrides and validated first (exit 2 on a problem, naming the key);
    then Ray starts (or is joined) and training runs with a live progress view on a terminal, or one
    line per step otherwise.

    Examples:

      rlhfctl train recipes/quickstart.yaml

      rlhfctl train quickstart trainer.total_steps=10 rollout.n=8

      rlhfctl train my.yaml ~roles.reference data.train_files=[a.jsonl,b.jsonl] --quiet

    Exit codes: 0 done, 1 internal error, 2 recipe/data/model error, 3 a worker died or timed out,
    4 diverged, 130 interrupted (Ctrl-C), 138 stopped by SIGUSR1, 143 stopped by SIGTERM (saved first).
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        cfg, path = load_for_command(recipe, overrides)  # before the heavy imports: a typo fails in a second
        refuse_missing_paths(cfg, err)
        show_library_output(verbose)
        # torch: after the recipe loads and its paths are checked, so a mistake is reported in about a second
        from rlhfctl.cli.essentials import render_essentials
        from rlhfctl.recipe.validate import validate_recipe

        report = validate_recipe(cfg)
        if not report.ok:
            render_issues(err, report)
            raise typer.Exit(EXIT_USER)
        check_output_dir(report.recipe)  # a used output_dir is refused before the run header is printed
        if not quiet:
            render_essentials(console, report.recipe, path, report)  # resolved once, by validate
            render_issues(console, report)
        from rlhfctl.trainer import run_training  # the trainer (torch, ray): only once the run starts

        with make_reporter(quiet, console, verbose=verbose, err_console=err) as reporter:
            run_training(cfg, reporter)

