"""``rlhfctl recipes list | show NAME | copy NAME DEST``: the recipes shipped with rlhfctl."""

from __future__ import annotations

import typer
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from rlhfctl.cli.console import complete_recipe, make_console, print_line
from rlhfctl.cli.errors import guarded
from rlhfctl.recipe.bundled import copy_bundled, find_bundled, list_bundled

__all__ = ["recipes_app"]

recipes_app = typer.Typer(
    help="List, show and copy the bundled recipes.\n\nExample: rlhfctl recipes copy quickstart my-recipe.yaml",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


@recipes_app.command("list")
def list_recipes() -> None:
    """List the bundled recipes with a one-line description each.

    Example: rlhfctl recipes list
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        recipes = list_bundled()
        if not recipes:
            print_line(console, "no bundled recipes found")
            return
        table = Table(show_header=True)
        table.add_column("name", style="bold")
        table.add_column("description")
        for recipe in recipes:
            table.add_row(Text(recipe.name), Text(recipe.description))
        console.print(table)


@recipes_app.command("show")
def show_recipe(name: str = typer.Argument(..., help="bundled recipe name, e.g. quickstart", autocompletion=complete_recipe)) -> None:
    """Print a bundled recipe (syntax-highlighted on a terminal).

    Example: rlhfctl recipes show quickstart
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        recipe = find_bundled(name)
        text = recipe.path.read_text(encoding="utf-8")
        if console.is_terminal:
            console.print(Syntax(text, "yaml", background_color="default"))
        else:
            console.file.write(text if text.endswith("\n") else text + "\n")


@recipes_app.command("copy")
def copy_recipe(
    name: str = typer.Argument(..., help="bundled recipe name", autocompletion=complete_recipe),
    dest: str = typer.Argument(..., help="destination file, or a folder to copy NAME.yaml into"),
    force: bool = typer.Option(False, "--force", "-f", help="overwrite an existing file"),
) -> None:
    """Copy a bundled recipe to DEST to edit it; refuses to overwrite an existing file without --force.

    Examples:

      rlhfctl recipes copy quickstart my-recipe.yaml

      rlhfctl recipes copy ppo-gae configs/ --force
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        target = copy_bundled(name, dest, force=force)
        print_line(console, f"copied {name} to {target}")
