"""load_recipe: schema defaults, then the YAML file, then command-line overrides, checked at each layer."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.field_checks import check_fields
from rlhfctl.recipe.overrides import apply_override, parse_override
from rlhfctl.recipe.schema import Recipe
from rlhfctl.recipe.typecheck import check_layer
from rlhfctl.recipe.typespec import ROOT
from rlhfctl.recipe.yaml_io import read_recipe_file

__all__ = ["load_recipe", "recipe_from_dict"]


def _wrap(error: OmegaConfBaseException, what: str) -> RecipeError:
    key = getattr(error, "full_key", None) or None
    message = str(getattr(error, "msg", None) or error).splitlines()[0]
    kind = "interpolation" if "nterpolation" in type(error).__name__ else "invalid"
    prefix = f"{key}: " if key else ""
    return RecipeError(f"{prefix}{message} ({what})", key_path=key, kind=kind)


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """The structured schema with its defaults (built once; callers get copies)."""
    return OmegaConf.structured(Recipe)


def _required_markers(value: Any, parts: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Key paths the user marked ``???`` (must be given by a later layer)."""
    if value == "???":
        return [parts]
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _required_markers(item, (*parts, str(key)))]
    return []


def recipe_from_dict(data: dict, overrides: Sequence[str] = ()) -> DictConfig:
    """Merge plain recipe data and overrides over the schema; check and resolve; raise RecipeError."""
    check_layer(data, ROOT)
    required = _required_markers(data)
    base = copy.deepcopy(_schema())
    if isinstance(data.get("resource_pools"), dict):
        base.resource_pools = {}  # a recipe that lists its pools replaces the default 'main'
    try:
        cfg: DictConfig = OmegaConf.merge(base, data)  # type: ignore[assignment]
    except OmegaConfBaseException as error:
        raise _wrap(error, "in the recipe") from None
    for text in overrides:
        override = parse_override(text)
        required = [p for p in required if p[: len(override.parts)] != override.parts]
        required += [] if override.delete else [(*override.parts, *p) for p in _required_markers(override.value)]
        try:
            cfg = apply_override(cfg, override)
        except OmegaConfBaseException as error:
            raise _wrap(error, f"override {text!r}") from None
    if required:
        path = ".".join(required[0])
        raise RecipeError(f"{path}: missing required value (the recipe marks it ??? ; give it, e.g. {path}=...)", key_path=path, kind="missing")
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise RecipeError(f"{missing[0]}: missing required value ('???' must be replaced)", key_path=missing[0], kind="missing")
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as error:
        raise _wrap(error, "resolving ${...}") from None
    problems = check_fields(OmegaConf.to_container(cfg))  # type: ignore[arg-type]
    if problems:
        raise problems[0]
    return cfg


def load_recipe(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> DictConfig:
    """Load a recipe file with ``key=value`` / ``~key`` overrides into a checked, resolved DictConfig."""
    return recipe_from_dict(read_recipe_file(path), list(overrides or ()))
