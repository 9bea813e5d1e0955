"""The recipe schema as a tree of simple type descriptions, with lookup by key path."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlhfctl.recipe.errors import RecipeError, did_you_mean
from rlhfctl.recipe.schema import RecipeSchema

__all__ = ["FieldInfo", "ROOT", "TypeSpec", "default_at", "field_info", "format_path", "iter_fields", "locate", "struct_fields"]

_SCALARS = {int: "int", float: "float", bool: "bool", str: "str"}
_DESCRIPTIONS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "any": "any value",
}


@dataclass(frozen=True)
class TypeSpec:
    """One node type: struct (a schema dataclass), dict, list, a scalar (int/float/bool/str) or any."""

    kind: str
    nullable: bool = False
    struct: type | None = None
    item: "TypeSpec | None" = None

    def describe(self) -> str:
        """Human words for the expected value, e.g. "a list of integers" or "a mapping (or null)"."""
        if self.kind == "struct":
            text = "a mapping"
        elif self.kind == "dict":
            text = "a mapping of names to values"
        elif self.kind == "list":
            inner = self.item.describe() if self.item else "values"
            text = f"a list of {_plural(inner)}"
        else:
            text = _DESCRIPTIONS[self.kind]
        return f"{text} (or null)" if self.nullable and self.kind != "any" else text


def _plural(description: str) -> str:
    words = {"an integer": "integers", "a number": "numbers", "a string": "strings", "true or false": "booleans"}
    return words.get(description, description)


def spec_of_hint(hint: Any) -> TypeSpec:
    """Translate a schema type hint into a TypeSpec."""
    nullable = False
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        nullable = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else Any
        origin = typing.get_origin(hint)
    if hint is Any:
        return TypeSpec("any", nullable=True)
    if dataclasses.is_dataclass(hint):
        return TypeSpec("struct", nullable, struct=hint)
    if origin in (dict, Mapping):
        return TypeSpec("dict", nullable, item=spec_of_hint(typing.get_args(hint)[1]))
    if origin in (list, Sequence):
        return TypeSpec("list", nullable, item=spec_of_hint(typing.get_args(hint)[0]))
    if hint in _SCALARS:
        return TypeSpec(_SCALARS[hint], nullable)
    raise TypeError(f"unsupported type in the recipe schema: {hint!r}")


@functools.lru_cache(maxsize=None)
def struct_fields(cls: type) -> dict[str, tuple[TypeSpec, dataclasses.Field]]:
    """Each field of a schema dataclass: its TypeSpec and its dataclasses.Field (metadata, default)."""
    hints = typing.get_type_hints(cls)
    return {f.name: (spec_of_hint(hints[f.name]), f) for f in dataclasses.fields(cls)}


ROOT = TypeSpec("struct", struct=RecipeSchema)


def format_path(parts: Sequence[str | int]) -> str:
    """["a", "b", 0] -> "a.b[0]"."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _field_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        value = f.default
    return _plain(value)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


@dataclass(frozen=True)
class FieldInfo:
    """A schema field at a key path: its type, default, help line and checks."""

    path: str
    spec: TypeSpec
    default: Any
    help: str
    metadata: Mapping[str, Any]


def _unknown_key(parts: Sequence[str], known: Sequence[str]) -> RecipeError:
    path = format_path(parts)
    parent = format_path(parts[:-1])
    suggestion = did_you_mean(parts[-1], known, prefix=f"{parent}." if parent else "")
    where = f"under '{parent}'" if parent else "at the top level"
    message = f"unknown key '{path}'{suggestion} (keys {where}: {', '.join(known)})"
    if list(parts[:-1]) == ["roles"]:
        message += "; the roles are fixed, but any importable class can be a role's worker"
    return RecipeError(message, key_path=path, kind="unknown_key")


def locate(parts: Sequence[str]) -> tuple[TypeSpec, FieldInfo | None]:
    """The TypeSpec at a key path and, for a schema field, its FieldInfo; unknown keys raise RecipeError."""
    spec, info = ROOT, None
    for depth, part in enumerate(parts):
        here = list(parts[: depth + 1])
        if spec.kind == "struct":
            fields = struct_fields(spec.struct)
            if part not in fields:
                raise _unknown_key(here, list(fields))
            spec, f = fields[part]
            info = FieldInfo(format_path(here), spec, _field_default(f), f.metadata.get("help", ""), f.metadata)
        elif spec.kind == "dict":
            spec, info = spec.item, None  # type: ignore[assignment]
        elif spec.kind == "any":
            return TypeSpec("any", nullable=True), None
        else:
            raise RecipeError(
                f"'{format_path(here)}': '{format_path(parts[:depth])}' is {spec.describe()}, it has no keys; "
                "give the whole value instead",
                key_path=format_path(parts),
                kind="unknown_key",
            )
    return spec, info


def field_info(path: str) -> FieldInfo | None:
    """The FieldInfo of a dotted schema path (None for dict entries); unknown keys raise RecipeError."""
    return locate([part for part in path.split(".") if part])[1]


def default_at(parts: Sequence[str]) -> Any:
    """The schema default at a key path (a plain value), or None inside dict entries."""
    info = locate(parts)[1]
    return None if info is None else info.default


def iter_fields(spec: TypeSpec = ROOT, prefix: str = "") -> Iterator[FieldInfo]:
    """Every schema field, depth first; dict entries appear as ``<name>`` (used by docs and tests)."""
    if spec.kind == "struct":
        for name, (child, f) in struct_fields(spec.struct).items():
            path = f"{prefix}.{name}" if prefix else name
            yield FieldInfo(path, child, _field_default(f), f.metadata.get("help", ""), f.metadata)
            yield from iter_fields(child, path)
    elif spec.kind == "dict" and spec.item is not None and spec.item.kind == "struct":
        yield from iter_fields(spec.item, f"{prefix}.<name>")
