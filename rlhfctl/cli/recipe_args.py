"""The RECIPE argument: a file path, or the name of a bundled recipe; loaded with the OVERRIDES."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

__all__ = ["load_for_command", "resolve_recipe_path"]


def resolve_recipe_path(recipe: str) -> Path:
    """An existing file as given, else a bundled recipe of that name (quickstart, ppo-gae, ...)."""
    from rlhfctl.recipe.bundled import bundled_path, list_bundled, recipe_stem
    from rlhfctl.recipe.errors import RecipeError, did_you_mean

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
    from rlhfctl.recipe.load import load_recipe

    from rlhfctl.recipe.errors import RecipeError

    path = resolve_recipe_path(recipe)
    try:
        return load_recipe(path, list(overrides or [])), path
    except RecipeError as error:
        if error.kind == "unknown_key" and error.key_path in ("stages", "output_dir"):
            raise RecipeError(f"{error}; {path} looks like a pipeline file: run rlhfctl pipeline {path}",
                              key_path=error.key_path, kind=error.kind) from None
        raise
