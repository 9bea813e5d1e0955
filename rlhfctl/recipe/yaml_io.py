"""Read a recipe file into plain data, turning YAML problems into RecipeError with file and line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlhfctl.recipe.errors import RecipeError

__all__ = ["read_recipe_file"]


def _yaml_message(path: Path, error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    detail = f"{problem} ({context})" if context else problem
    return f"{where}: YAML syntax error: {detail}"


def read_recipe_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The recipe file as a plain dict (interpolations kept as strings); an empty file gives {}."""
    file = Path(os.path.expanduser(str(path)))
    if not file.exists():
        raise RecipeError(f"recipe file not found: {file} (working directory {os.getcwd()})", kind="file_not_found")
    if not file.is_file():
        raise RecipeError(f"recipe path is not a file: {file}", kind="file_not_found")
    try:
        loaded = OmegaConf.load(file)
    except yaml.YAMLError as error:
        raise RecipeError(_yaml_message(file, error), kind="yaml_syntax") from None
    except (OmegaConfBaseException, UnicodeDecodeError, ValueError) as error:
        raise RecipeError(f"{file}: cannot read the recipe: {error}".splitlines()[0], kind="yaml_syntax") from None
    if not isinstance(loaded, DictConfig):
        raise RecipeError(f"{file}: the recipe must be a YAML mapping of sections (ray, roles, data, ...), got a list", kind="wrong_type")
    return OmegaConf.to_container(loaded, resolve=False)  # type: ignore[return-value]
