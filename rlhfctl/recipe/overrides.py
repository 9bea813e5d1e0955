"""Command-line overrides: ``key.path=value`` (YAML value) and ``~key.path`` (back to default / null)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from rlhfctl.recipe.errors import RecipeError, did_you_mean
from rlhfctl.recipe.typecheck import check_layer
from rlhfctl.recipe.typespec import locate

__all__ = ["Override", "apply_override", "parse_override"]

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
