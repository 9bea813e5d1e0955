"""Check one layer of a recipe (the YAML file, or one override) against the schema's types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.typespec import TypeSpec, format_path, locate, struct_fields

__all__ = ["check_layer", "is_placeholder", "show_value"]


def is_placeholder(value: Any) -> bool:
    """True for values checked only after merging: ``???`` (required) and ``${...}`` interpolations."""
    return isinstance(value, str) and (value == "???" or "${" in value)


def show_value(value: Any) -> str:
    """A short rendering of a user value and its YAML kind, for messages."""
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "mapping"}
    kind = next((name for cls, name in kinds.items() if type(value) is cls), type(value).__name__)
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({kind})"


def _wrong_type(parts: Sequence[str | int], spec: TypeSpec, value: Any) -> RecipeError:
    path = format_path(parts)
    return RecipeError(f"{path}: expected {spec.describe()}, got {show_value(value)}", key_path=path, kind="wrong_type")


def _scalar_ok(kind: str, value: Any) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    return True


def check_layer(value: Any, spec: TypeSpec, parts: Sequence[str | int] = ()) -> None:
    """Raise RecipeError for the first unknown key, wrong type or null-where-required in ``value``."""
    if is_placeholder(value):
        return
    if value is None:
        if spec.nullable or spec.kind == "any":
            return
        path = format_path(parts)
        raise RecipeError(
            f"{path}: missing required value ({spec.describe()}); null is not allowed here",
            key_path=path,
            kind="missing",
        )
    if spec.kind == "struct":
        if not isinstance(value, Mapping):
            raise _wrong_type(parts, spec, value)
        fields = struct_fields(spec.struct)
        for key, item in value.items():
            if not isinstance(key, str) or key not in fields:
                locate([*(p for p in parts if isinstance(p, str)), str(key)])  # raises unknown key
            check_layer(item, fields[key][0], [*parts, key])
    elif spec.kind == "dict":
        if not isinstance(value, Mapping):
            raise _wrong_type(parts, spec, value)
        for key, item in value.items():
            if not isinstance(key, str):
                path = format_path([*parts, str(key)])
                raise RecipeError(f"{path}: names must be strings, got {show_value(key)}", key_path=path, kind="wrong_type")
            check_layer(item, spec.item, [*parts, key])  # type: ignore[arg-type]
    elif spec.kind == "list":
        if not isinstance(value, (list, tuple)):
            raise _wrong_type(parts, spec, value)
        for index, item in enumerate(value):
            check_layer(item, spec.item, [*parts, index])  # type: ignore[arg-type]
    elif not _scalar_ok(spec.kind, value):
        raise _wrong_type(parts, spec, value)
