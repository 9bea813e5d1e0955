"""load_recipe: schema defaults, then the YAML file, then command-line overrides, checked at each layer.

The file is read into plain data (YAML problems become a RecipeError with file and line). Overrides are
``key.path=value`` (a YAML value) and ``~key.path`` (back to the default / null).
"""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from rlhfctl.recipe.errors import RecipeError, did_you_mean
from rlhfctl.recipe.field_checks import check_fields, check_layer
from rlhfctl.recipe.schema import RecipeSchema
from rlhfctl.recipe.typespec import ROOT, locate

__all__ = ["Override", "apply_override", "load_recipe", "parse_override", "read_recipe_file", "recipe_from_dict"]

def _wrap(error: OmegaConfBaseException, what: str) -> RecipeError:
    key = getattr(error, "full_key", None) or None
    message = str(getattr(error, "msg", None) or error).splitlines()[0]
    kind = "interpolation" if "nterpolation" in type(error).__name__ else "invalid"
    prefix = f"{key}: " if key else ""
    return RecipeError(f"{prefix}{message} ({what})", key_path=key, kind=kind)


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """The structured schema with its defaults (built once; callers get copies)."""
    return OmegaConf.structured(RecipeSchema)


def _required_markers(value: Any, parts: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Key paths the user marked ``???`` (must be given by a later layer)."""
    if value == "???":
        return [parts]
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _required_markers(item, (*parts, str(key)))]
    return []


def merged_over_schema(data: dict) -> DictConfig:
    """Plain recipe data merged over the schema's defaults (types checked, nothing else); raise RecipeError."""
    check_layer(data, ROOT)
    base = copy.deepcopy(_schema())
    if isinstance(data.get("resource_pools"), dict):
        base.resource_pools = {}  # a recipe that lists its pools replaces the default 'main'
    try:
        return OmegaConf.merge(base, data)  # type: ignore[return-value]
    except OmegaConfBaseException as error:
        raise _wrap(error, "in the recipe") from None


def recipe_from_dict(data: dict, overrides: Sequence[str] = ()) -> DictConfig:
    """Merge plain recipe data and overrides over the schema; check and resolve; raise RecipeError."""
    required = _required_markers(data)
    cfg = merged_over_schema(data)
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


# ---------------------------------------------------------------------------------- the recipe file
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


# ---------------------------------------------------------------------------------- overrides
_KEY = re.compile(r"^[A-Za-z_][\w\-]*(\.[\w\-]+)*$")


@dataclass(frozen=True)
class Override:
    """One parsed override: set ``parts`` to ``value``, or delete it."""

    text: str
    parts: tuple[str, ...]
    delete: bool = False
    value: Any = None

    @property
    def key(self) -> str:
        """The dotted key path."""
        return ".".join(self.parts)


def parse_override(text: str) -> Override:
    """Parse ``a.b=value`` (value read as YAML: numbers, null, [lists], {maps}) or ``~a.b``."""
    raw = text.strip()
    delete = raw.startswith("~")
    if delete:
        key, sep, value_text = raw[1:].partition("=")
        if sep:
            raise RecipeError(f"override {text!r}: '~key' deletes a key and takes no value", key_path=key, kind="override_syntax")
    else:
        key, sep, value_text = raw.partition("=")
        if not sep:
            raise RecipeError(
                f"override {text!r}: expected key=value (e.g. trainer.total_steps=10) or ~key to reset a key",
                key_path=key or None,
                kind="override_syntax",
            )
    key = key.strip()
    if not _KEY.match(key):
        raise RecipeError(
            f"override {text!r}: {key!r} is not a dotted key path like trainer.total_steps "
            "(set a whole list at once: key=[a,b])",
            key_path=key or None,
            kind="override_syntax",
        )
    parts = tuple(key.split("."))
    if delete:
        return Override(text, parts, delete=True)
    try:
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={value_text}"]), resolve=False)["v"]  # type: ignore[index]
    except (yaml.YAMLError, OmegaConfBaseException) as error:
        first = str(error).splitlines()[0]
        raise RecipeError(f"override {text!r}: cannot read the value {value_text!r}: {first}", key_path=key, kind="override_syntax") from None
    return Override(text, parts, value=value)


def _nested(parts: tuple[str, ...], value: Any) -> dict[str, Any]:
    for part in reversed(parts):
        value = {part: value}
    return value


def apply_override(cfg: DictConfig, override: Override) -> DictConfig:
    """Check ``override`` against the schema and return ``cfg`` with it applied."""
    spec, info = locate(override.parts)
    if override.delete:
        _delete(cfg, override, info)
        return cfg
    check_layer(override.value, spec, list(override.parts))
    if override.parts == ("resource_pools",) and isinstance(override.value, dict):
        cfg.resource_pools = {}  # a whole pool mapping replaces the pools, as in a recipe file
    return OmegaConf.merge(cfg, _nested(override.parts, override.value))  # type: ignore[return-value]


def _delete(cfg: DictConfig, override: Override, info: Any) -> None:
    parts = override.parts
    parent_key = ".".join(parts[:-1])
    parent = OmegaConf.select(cfg, parent_key, default=None) if parent_key else cfg
    if parent is None:
        return  # inside an absent (null) section: already unset
    if info is None:  # an entry of a free-form mapping (a pool, a model.config field)
        if parts[-1] not in parent:
            existing = [str(k) for k in parent.keys()]
            raise RecipeError(
                f"override {override.text!r}: '{override.key}' is not set, nothing to delete{did_you_mean(parts[-1], existing)}",
                key_path=override.key,
                kind="unknown_key",
            )
        with open_dict(parent):
            del parent[parts[-1]]
        return
    value = None if info.spec.nullable else info.default
    OmegaConf.update(cfg, override.key, value, merge=False)
