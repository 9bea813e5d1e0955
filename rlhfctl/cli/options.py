"""Argument and option declarations shared by several commands."""

from __future__ import annotations

import enum
from typing import List, Optional

import typer

__all__ = ["OutputFormat", "OverridesArg", "RecipeArg", "complete_recipe"]


class OutputFormat(str, enum.Enum):
    """Human tables or machine-readable JSON."""

    table = "table"
    json = "json"


def complete_recipe(incomplete: str) -> list[str]:
    """Shell completion: bundled recipe names."""
    from rlhfctl.recipe.bundled import list_bundled

    return [recipe.name for recipe in list_bundled() if recipe.name.startswith(incomplete)]


def RecipeArg() -> str:  # noqa: N802 - reads like the typer.Argument it returns
    """The RECIPE argument: a YAML file, or a bundled recipe name."""
    return typer.Argument(..., help="recipe YAML file, or the name of a bundled recipe (rlhfctl recipes list)",
                          autocompletion=complete_recipe, show_default=False)


def OverridesArg() -> Optional[List[str]]:  # noqa: N802
    """The OVERRIDES... arguments."""
    return typer.Argument(None, show_default=False,
                          help="key=value overrides (trainer.total_steps=10, data.train_files=[a.jsonl,b.jsonl]) or ~key to reset a key")
