"""What every command shares: consoles for its output, the RECIPE and OVERRIDES arguments, and loading them.

Consoles show colour and live views on a terminal, and wide plain text otherwise (without the escape codes other
libraries print, once a command calls :func:`show_library_output`). RECIPE is a file path
or the name of a bundled recipe, loaded with the OVERRIDES.
"""

from __future__ import annotations

import enum
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.console import Console
from rich.text import Text

from rlhfctl.library_output import VERBOSE_VARIABLE, plain_when_not_a_terminal, quiet_this_process
from rlhfctl.recipe.bundled import bundled_path, list_bundled, recipe_stem
from rlhfctl.recipe.errors import RecipeError, did_you_mean
from rlhfctl.recipe.load import load_recipe

if TYPE_CHECKING:  # only for annotations
    from omegaconf import DictConfig

__all__ = ["OutputFormat", "OverridesArg", "RecipeArg", "complete_recipe", "load_for_command", "make_console", "print_error",
           "print_line", "refuse_missing_paths", "resolve_recipe_path", "show_library_output"]

_PLAIN_WIDTH = 120


def make_console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr) that is 120 columns wide when not a terminal (logs, CI, pipes)."""
    stream = sys.stderr if stderr else sys.stdout
    terminal = bool(getattr(stream, "isatty", lambda: False)())
    width = None if terminal or os.environ.get("COLUMNS") else _PLAIN_WIDTH
    return Console(stderr=stderr, width=width, highlight=False)


def print_line(console: Console, text: str, style: str = "") -> None:
    """Print one line as-is (no markup, no wrapping), optionally styled."""
    console.print(Text(text, style=style), soft_wrap=True)


def print_error(console: Console, text: str) -> None:
    """Print a one-line red error message."""
    print_line(console, f"error: {text}", "bold red")


def refuse_missing_paths(cfg: DictConfig, err: Console) -> None:
    """Report the recipe's missing data files, model directories and resume checkpoint, one ``error:`` line
    each, and exit 2: checked before the heavy imports, so such a mistake is reported in about a second."""
    # the command's modules load when it runs, off rlhfctl --help's path
    from rlhfctl.recipe.check_paths import path_errors

    problems = path_errors(cfg)
    for issue in problems:
        print_error(err, issue.message)
    if problems:
        raise typer.Exit(2)


def show_library_output(verbose: bool) -> None:
    """``--verbose`` lets other libraries' bars and warnings through, here and in every worker; else they are kept off.
    Either way, stdout and stderr that are not terminals get no escape codes (Ray's coloured worker and raylet lines)."""
    if verbose:
        os.environ[VERBOSE_VARIABLE] = "1"  # an RLHFCTL_* variable: it reaches the workers too
    quiet_this_process()
    plain_when_not_a_terminal()


# ---------------------------------------------------------------------------------- arguments and options
class OutputFormat(str, enum.Enum):
    """Human tables or machine-readable JSON."""

    table = "table"
    json = "json"


def complete_recipe(incomplete: str) -> list[str]:
    """Shell completion: bundled recipe names."""
    return [recipe.name for recipe in list_bundled() if recipe.name.startswith(incomplete)]


def RecipeArg() -> str:  # noqa: N802 - reads like the typer.Argument it returns
    """The RECIPE argument: a YAML file, or a bundled recipe name."""
    return typer.Argument(..., help="recipe YAML file, or the name of a bundled recipe (rlhfctl recipes list)",
                          autocompletion=complete_recipe, show_default=False)


def OverridesArg() -> Optional[List[str]]:  # noqa: N802
    """The OVERRIDES... arguments."""
    return typer.Argument(None, show_default=False,
                          help="key=value overrides (trainer.total_steps=10, data.train_files=[a.jsonl,b.jsonl]) or ~key to reset a key")


# ---------------------------------------------------------------------------------- loading RECIPE
def resolve_recipe_path(recipe: str) -> Path:
    """An existing file as given, else a bundled recipe of that name (quickstart, ppo-gae, ...)."""
    path = Path(recipe).expanduser()
    if path.exists():
        return path
    found = bundled_path(recipe)
    if found is not None:
        return found
    bundled = [item.name for item in list_bundled()]
    hint = did_you_mean(recipe_stem(recipe), bundled) if "/" not in recipe else ""
    names = ", ".join(sorted(bundled)) or "none"
    raise RecipeError(f"recipe file not found: {recipe}{hint} (bundled recipes: {names})", kind="file_not_found")


def load_for_command(recipe: str, overrides: list[str] | None) -> tuple[DictConfig, Path]:
    """Load RECIPE with OVERRIDES (RecipeError on any problem)."""
    path = resolve_recipe_path(recipe)
    try:
        return load_recipe(path, list(overrides or [])), path
    except RecipeError as error:
        if error.kind == "unknown_key" and error.key_path in ("stages", "output_dir"):
            raise RecipeError(f"{error}; {path} looks like a pipeline file: run rlhfctl pipeline {path}",
                              key_path=error.key_path, kind=error.kind) from None
        raise
