"""The recipe as a JSON Schema (draft 2020-12), generated from :mod:`rlhfctl.recipe.schema`: editors complete keys.

One source: the schema dataclasses, walked through :mod:`rlhfctl.recipe.typespec` (the same type tree the
loader's per-layer checks use), their ``_field`` metadata giving the description (``help``), ``default``,
``enum`` (``choices``, provider names looked up in :mod:`rlhfctl.recipe.field_checks`) and bounds. Schema
sections are closed objects (``additionalProperties: false``, so a misspelled key is an error); mappings of
names (``resource_pools``, ``model.config``, ``function_kwargs``, ...) are open.

What the loader accepts beyond the declared types passes too: ``???`` (required, given by a later layer) and
``${...}`` interpolations anywhere (see :func:`rlhfctl.recipe.field_checks.is_placeholder`).

Only keywords that draft-07 tools read the same way are used (``type`` lists, ``properties``,
``additionalProperties``, ``items`` as one schema, ``anyOf``, ``enum``, numeric ``exclusiveMinimum``; no ``$ref``,
``$defs`` or ``prefixItems``): the YAML language server (VS Code's YAML extension and others) implements draft-07.
``patternErrorMessage`` (an editor extension keyword that validators ignore) makes its message for a wrong type
read "expected an integer" rather than quote the placeholder pattern.

``rlhfctl recipes schema`` prints it; ``recipes/recipe.schema.json`` is that output, shipped beside the bundled
recipes, whose first line (:data:`MODELINE`) points editors at it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlhfctl.recipe.field_checks import choice_pattern, choices_for
from rlhfctl.recipe.schema import RecipeSchema
from rlhfctl.recipe.typespec import TypeSpec, struct_fields

__all__ = ["DRAFT", "MODELINE", "MODELINE_PREFIX", "PLACEHOLDER_PATTERN", "SCHEMA_FILE_NAME", "TITLE", "is_recipe_schema_file",
           "modeline_target", "recipe_json_schema", "render_json_schema", "write_schema_beside"]

DRAFT = "https://json-schema.org/draft/2020-12/schema"
TITLE = "rlhfctl recipe"
SCHEMA_FILE_NAME = "recipe.schema.json"
"""The schema's file name: shipped beside the bundled recipes, written beside a copied one."""
MODELINE_PREFIX = "# yaml-language-server: $schema="
MODELINE = f"{MODELINE_PREFIX}{SCHEMA_FILE_NAME}"
"""The first line of every bundled recipe: the YAML language server reads the schema from the file beside it."""
PLACEHOLDER_PATTERN = r"^\?\?\?$|\$\{"
"""Strings the loader takes for any type (``???`` and ``${...}``), as ``field_checks.is_placeholder`` tells them."""

_JSON_TYPES = {"int": "integer", "float": "number", "bool": "boolean", "str": "string", "struct": "object",
               "dict": "object", "list": "array"}
_BOUNDS = {"min": "minimum", "max": "maximum", "min_exclusive": "exclusiveMinimum", "max_exclusive": "exclusiveMaximum"}
_LENGTHS = {"min_items": "minItems", "max_items": "maxItems"}
_KNOWN_METADATA = {"help", "choices", "kind", *_BOUNDS, *_LENGTHS}


def recipe_json_schema() -> dict[str, Any]:
    """The JSON Schema of a recipe file, as a dict."""
    root = _struct(RecipeSchema)
    return {
        "$schema": DRAFT,
        "title": TITLE,
        "description": (
            "An rlhfctl recipe (docs/recipes.md). Generated from rlhfctl/recipe/schema.py by `rlhfctl recipes schema`; "
            "`rlhfctl validate` checks everything this schema cannot (files, workers, batch arithmetic)."
        ),
        **root,
    }


def render_json_schema() -> str:
    """The schema as the text ``rlhfctl recipes schema`` prints and ``recipes/recipe.schema.json`` holds."""
    return json.dumps(recipe_json_schema(), indent=2, ensure_ascii=False) + "\n"


def modeline_target(text: str) -> str | None:
    """The schema a recipe's first line points the YAML language server at (``$schema=...``), or None."""
    first = text.split("\n", 1)[0].strip()
    if not first.startswith(MODELINE_PREFIX):
        return None
    return first[len(MODELINE_PREFIX):].strip() or None


# ---------------------------------------------------------------------------------- the walk
def _struct(cls: type) -> dict[str, Any]:
    """A schema section: a closed object, each field with its description, default, choices and bounds."""
    return {
        "type": "object",
        "properties": {name: _field(cls, name, spec, f) for name, (spec, f) in struct_fields(cls).items()},
        "additionalProperties": False,
    }


def _field(cls: type, name: str, spec: TypeSpec, f: dataclasses.Field) -> dict[str, Any]:
    metadata: Mapping[str, Any] = f.metadata
    unknown = set(metadata) - _KNOWN_METADATA
    if unknown:  # a new kind of check: the schema must learn it (one source, nothing silently dropped)
        raise TypeError(f"{cls.__name__}.{name}: field metadata {sorted(unknown)} has no JSON Schema translation")
    if metadata.get("kind") == "target_modules":
        node = _target_modules()
    elif "kind" in metadata:
        raise TypeError(f"{cls.__name__}.{name}: field kind {metadata['kind']!r} has no JSON Schema translation")
    else:
        node = _node(spec, metadata, where=f"{cls.__name__}.{name}")
    described: dict[str, Any] = {"description": metadata.get("help", "")}
    default = _default(f)
    if default is not _NO_DEFAULT:
        described["default"] = default
    return {**described, **node}


def _node(spec: TypeSpec, metadata: Mapping[str, Any] | None = None, where: str = "") -> dict[str, Any]:
    """The schema of one value of ``spec``; ``metadata`` (a field's checks) applies to it, or to a list's items."""
    metadata = metadata or {}
    if spec.kind == "any":
        return {}
    if spec.kind == "struct":
        node = _struct(spec.struct)  # type: ignore[arg-type]
    elif spec.kind == "dict":
        item = _node(spec.item) if spec.item is not None else {}  # type: ignore[arg-type]
        node = {"type": "object", "additionalProperties": item or True}
    elif spec.kind == "list":
        item_checks = {key: value for key, value in metadata.items() if key in _BOUNDS or key == "choices"}
        node = {"type": "array", "items": _node(spec.item, item_checks, where)}  # type: ignore[arg-type]
        node.update({_LENGTHS[key]: metadata[key] for key in _LENGTHS if key in metadata})
    else:
        node = {"type": _JSON_TYPES[spec.kind]}
        node.update(_bounds(spec, metadata, where))
    if "choices" in metadata and spec.kind != "list":
        if spec.kind != "str":
            raise TypeError(f"{where}: choices on a {spec.kind} field have no JSON Schema translation")
        allowed: list[Any] = list(choices_for(metadata["choices"]))
        enum = allowed + [None] if spec.nullable else allowed
        pattern = choice_pattern(metadata["choices"])  # names beyond the list (reasoning_gym:<dataset> tasks)
        named = [{"type": "string", "pattern": pattern}] if pattern else []
        return {"anyOf": [{"enum": enum}, *named, _placeholder()]}
    types = [node["type"]]
    if spec.nullable:
        types.append("null")
    if spec.kind != "str":  # a string here can only be a placeholder (strings pass as they are)
        types.append("string")
        node["pattern"] = PLACEHOLDER_PATTERN
        node["patternErrorMessage"] = f"expected {spec.describe()}; a string here must be a ${{...}} interpolation or ???"
    node["type"] = types[0] if len(types) == 1 else types
    return node


def _bounds(spec: TypeSpec, metadata: Mapping[str, Any], where: str) -> dict[str, Any]:
    found = {_BOUNDS[key]: metadata[key] for key in _BOUNDS if key in metadata}
    if found and spec.kind not in ("int", "float"):
        raise TypeError(f"{where}: bounds on a {spec.kind} value have no JSON Schema translation")
    return found


def _placeholder() -> dict[str, Any]:
    return {"type": "string", "pattern": PLACEHOLDER_PATTERN}


def _target_modules() -> dict[str, Any]:
    """``lora.target_modules``: 'all-linear' (any non-empty name) or a non-empty list of module names."""
    name = {"type": "string", "minLength": 1}
    return {"anyOf": [name, {"type": "array", "items": name, "minItems": 1}]}


_NO_DEFAULT = object()


def _default(f: dataclasses.Field) -> Any:
    """The field's default as JSON; none for a section (its keys carry their own defaults)."""
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        value = f.default
    if dataclasses.is_dataclass(value):
        return _NO_DEFAULT
    plain = _plain(value)
    if isinstance(plain, float) and not math.isfinite(plain):
        return _NO_DEFAULT  # JSON has no inf / nan
    return plain


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


# ---------------------------------------------------------------------------------- the file beside a recipe
def is_recipe_schema_file(path: Path) -> bool:
    """True when ``path`` holds a schema this module wrote (any version): safe to refresh."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("title") == TITLE


def write_schema_beside(recipe: Path) -> tuple[Path | None, bool]:
    """Write the schema the first line of ``recipe`` names (a relative path, e.g. ``recipe.schema.json`` beside it).

    Returns (the schema file, whether it was written): (None, False) when the recipe has no such line or it names a
    URL or an absolute path; (file, False) when that file exists and is not an rlhfctl recipe schema (left as it is).
    An existing rlhfctl recipe schema there is rewritten, so a copy made by a newer rlhfctl refreshes it.
    """
    try:
        target = modeline_target(recipe.read_text(encoding="utf-8"))
    except OSError:
        return None, False
    if target is None or "://" in target or Path(target).is_absolute():
        return None, False
    schema = recipe.parent / target
    if schema.exists() and not is_recipe_schema_file(schema):
        return schema, False
    schema.parent.mkdir(parents=True, exist_ok=True)
    schema.write_text(render_json_schema(), encoding="utf-8")
    return schema, True
