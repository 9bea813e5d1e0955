"""The recipes shipped with rlhfctl: ``rlhfctl/recipes_bundled/`` when installed, the checkout's ``recipes/`` otherwise.

The wheel ships the checkout's ``recipes/*.yaml`` as ``rlhfctl/recipes_bundled/`` (see setup.py), so one
folder holds them either way and :func:`bundled_dir` is the one place that finds it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import rlhfctl
from rlhfctl.recipe.errors import RecipeError, did_you_mean

__all__ = ["BundledRecipe", "bundled_dir", "bundled_path", "copy_bundled", "find_bundled", "list_bundled",
           "recipe_description", "recipe_stem"]


@dataclass(frozen=True)
class BundledRecipe:
    """A shipped recipe: its name (file stem), file and one-line description."""

    name: str
    path: Path
    description: str


def bundled_dir() -> Path | None:
    """The folder of the bundled recipes: the installed package's, else the source checkout's; None if neither exists."""
    package = Path(rlhfctl.__file__).resolve().parent
    for folder in (package / "recipes_bundled", package.parent / "recipes"):
        if folder.is_dir():
            return folder
    return None


def recipe_description(path: Path) -> str:
    """The recipe's first comment line, without the '#' (the editor's ``# yaml-language-server:`` line skipped)."""
    try:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                stripped = line.strip()
                text = stripped.lstrip("#").strip()
                if stripped.startswith("#") and not text.startswith("yaml-language-server:"):
                    return text
    except OSError:
        return ""
    return ""


def list_bundled() -> list[BundledRecipe]:
    """Every bundled recipe, by name."""
    folder = bundled_dir()
    if folder is None:
        return []
    return [BundledRecipe(path.stem, path, recipe_description(path)) for path in sorted(folder.glob("*.yaml"))]


def recipe_stem(name: str) -> str:
    """``name`` without a trailing .yaml: how bundled recipes are named."""
    return name[: -len(".yaml")] if name.endswith(".yaml") else name


def bundled_path(value: str) -> Path | None:
    """The file of the bundled recipe named ``value`` (a bare name, .yaml optional); None when there is none."""
    if "/" in value:
        return None
    recipes = {recipe.name: recipe.path for recipe in list_bundled()}
    return recipes.get(recipe_stem(value))


def find_bundled(name: str) -> BundledRecipe:
    """The bundled recipe called ``name`` (with or without .yaml); RecipeError listing the names otherwise."""
    stem = recipe_stem(name)
    recipes = {recipe.name: recipe for recipe in list_bundled()}
    if stem in recipes:
        return recipes[stem]
    names = sorted(recipes)
    raise RecipeError(
        f"no bundled recipe named {name!r}{did_you_mean(stem, names)} (bundled: {', '.join(names) or 'none found'})",
        kind="file_not_found",
    )


def copy_bundled(name: str, dest: str | os.PathLike[str], force: bool = False) -> Path:
    """Copy a bundled recipe to ``dest`` (a file, or a folder to put NAME.yaml in); refuse to overwrite unless ``force``."""
    recipe = find_bundled(name)
    target = Path(os.path.expanduser(str(dest)))
    if target.is_dir() or str(dest).endswith(("/", os.sep)):
        target = target / recipe.path.name
    if target.exists() and not force:
        raise RecipeError(f"{target} already exists; pass --force to overwrite it", kind="exists")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(recipe.path, target)
    return target
