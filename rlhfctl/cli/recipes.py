"""``rlhfctl recipes list | show NAME | copy NAME DEST | schema``: the recipes shipped with rlhfctl, and their JSON Schema."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from rlhfctl.cli.console import complete_recipe, make_console, print_line
from rlhfctl.cli.errors import guarded
from rlhfctl.recipe.bundled import copy_bundled, find_bundled, list_bundled
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.json_schema import render_json_schema, write_schema_beside

__all__ = ["recipes_app"]

recipes_app = typer.Typer(
    help="List, show and copy the bundled recipes; print the recipe's JSON Schema.\n\nExample: rlhfctl recipes copy quickstart my-recipe.yaml",
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

    The copy's first line points editors at recipe.schema.json, written (or refreshed) beside it, for key
    completion and checks as you type (docs/recipes.md, "Editing recipes with completion").

    Examples:

      rlhfctl recipes copy quickstart my-recipe.yaml

      rlhfctl recipes copy ppo-gae configs/ --force
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        target = copy_bundled(name, dest, force=force)
        print_line(console, f"copied {name} to {target}")
        try:
            schema, written = write_schema_beside(target)
        except OSError as error:  # the copy is made; only the editor's schema is missing
            print_line(err, f"note: could not write the JSON Schema beside {target}: {error.strerror or error} "
                            "(rlhfctl recipes schema --output FILE writes it elsewhere)", "yellow")
            return
        if written:
            print_line(console, f"wrote {schema} (the JSON Schema its first line points editors at)")
        elif schema is not None:
            print_line(err, f"note: left {schema} as it is (not an rlhfctl recipe schema); the copy's first line points "
                            "editors at it: write the schema elsewhere with rlhfctl recipes schema --output FILE "
                            "and change that line", "yellow")


@recipes_app.command("schema")
def recipe_schema(
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="write the schema to this file instead of stdout"),
) -> None:
    """Print the recipe's JSON Schema (draft 2020-12), generated from the recipe schema: every key, its type,
    default, choices, bounds and help.

    Editors with the YAML language server (VS Code's YAML extension, ...) complete and check a recipe whose first
    line is '# yaml-language-server: $schema=recipe.schema.json' (or another path or URL of this file).

    Examples:

      rlhfctl recipes schema > recipe.schema.json

      rlhfctl recipes schema --output configs/recipe.schema.json
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        text = render_json_schema()
        if output is None:
            console.file.write(text)
            return
        output = output.expanduser()
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text, encoding="utf-8")
        except OSError as error:
            raise RecipeError(f"cannot write the schema to {output}: {error.strerror or error}") from None
        print_line(err, f"wrote {output}")
