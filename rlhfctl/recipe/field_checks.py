"""Per-field checks: each layer's types (the YAML file, each override), and on the merged recipe the allowed
choices (some lists come from other packages, looked up by name), numeric bounds and required values."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from rlhfctl.algorithms.choices import KL_KINDS, LOSS_AGG_MODES
from rlhfctl.data.choices import OVERLONG_POLICIES
from rlhfctl.recipe.errors import RecipeError, did_you_mean
from rlhfctl.recipe.typespec import ROOT, TypeSpec, format_path, locate, struct_fields

__all__ = ["check_fields", "check_layer", "choice_pattern", "choice_problem", "choices_for", "is_placeholder", "show_value"]

_BOUNDS = (
    ("min", lambda v, b: v >= b, ">="),
    ("min_exclusive", lambda v, b: v > b, ">"),
    ("max", lambda v, b: v <= b, "<="),
    ("max_exclusive", lambda v, b: v < b, "<"),
)


def check_fields(recipe: Mapping[str, Any]) -> list[RecipeError]:
    """Every problem with choices, bounds and required values in a merged, resolved recipe (plain dict)."""
    problems: list[RecipeError] = []
    _walk(recipe, ROOT, [], problems)
    problems.extend(_required_values(recipe))
    return problems


def _walk(value: Any, spec: TypeSpec, parts: list[str | int], problems: list[RecipeError]) -> None:
    if value is None:
        return
    if spec.kind == "struct" and isinstance(value, Mapping):
        for name, (child, f) in struct_fields(spec.struct).items():
            item = value.get(name)
            path = [*parts, name]
            _check_leaf(item, f.metadata, path, problems)
            _walk(item, child, path, problems)
    elif spec.kind == "dict" and isinstance(value, Mapping) and spec.item is not None:
        for name, item in value.items():
            _walk(item, spec.item, [*parts, str(name)], problems)


def _check_leaf(value: Any, metadata: Mapping[str, Any], parts: list[str | int], problems: list[RecipeError]) -> None:
    if value is None:
        return
    path = format_path(parts)
    if "choices" in metadata and isinstance(value, str):
        problem = choice_problem(metadata["choices"], value)
        if problem is not None:
            problems.append(RecipeError(f"{path}: {problem}", key_path=path, kind="bad_choice"))
    if metadata.get("kind") == "target_modules":
        _check_target_modules(value, path, problems)
    if isinstance(value, (list, tuple)):
        _check_length(value, metadata, path, problems)
        for index, item in enumerate(value):
            _check_bounds(item, metadata, format_path([*parts, index]), problems)
    else:
        _check_bounds(value, metadata, path, problems)


def _check_bounds(value: Any, metadata: Mapping[str, Any], path: str, problems: list[RecipeError]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    for key, test, words in _BOUNDS:
        if key in metadata and (math.isnan(value) or not test(value, metadata[key])):
            problems.append(RecipeError(
                f"{path}: must be {words} {metadata[key]}, got {value!r}", key_path=path, kind="out_of_range"
            ))
            return


def _check_length(value: Sequence[Any], metadata: Mapping[str, Any], path: str, problems: list[RecipeError]) -> None:
    low, high = metadata.get("min_items"), metadata.get("max_items")
    if low is not None and len(value) < low or high is not None and len(value) > high:
        wanted = f"exactly {low}" if low == high else f"at least {low}" if high is None else f"{low} to {high}"
        problems.append(RecipeError(
            f"{path}: needs {wanted} item(s), got {len(value)}", key_path=path, kind="out_of_range"
        ))


def _check_target_modules(value: Any, path: str, problems: list[RecipeError]) -> None:
    if isinstance(value, str) and value:
        return
    if isinstance(value, (list, tuple)) and value and all(isinstance(item, str) and item for item in value):
        return
    problems.append(RecipeError(
        f"{path}: expected 'all-linear' or a non-empty list of module names, got {show_value(value)}",
        key_path=path,
        kind="wrong_type",
    ))


def _missing(path: str, what: str) -> RecipeError:
    return RecipeError(f"{path}: missing required value: {what}", key_path=path, kind="missing")


def _required_values(recipe: Mapping[str, Any]) -> list[RecipeError]:
    problems = []
    roles = recipe.get("roles") or {}
    stage = str((recipe.get("algorithm") or {}).get("name") or "ppo")  # sft/dpo train the actor, reward_model the reward
    if roles.get("actor") is None and stage != "reward_model":
        problems.append(_missing("roles.actor", "every recipe needs an actor (the policy)"))
    distills_alone = roles.get("teacher") is not None and not ((recipe.get("algorithm") or {}).get("distillation") or {}).get("mix")
    if roles.get("reward") is None and (stage == "reward_model" or (stage == "ppo" and not distills_alone)):
        problems.append(_missing("roles.reward", "every recipe needs a reward role (a function or a reward model), "
                                                 "except distillation alone (roles.teacher with algorithm.distillation.mix 0)"))
    for role in ("actor", "reference", "critic", "reward"):
        section = roles.get(role)
        if not section:
            continue
        model = section.get("model")
        if model is not None and not model.get("path") and not model.get("config"):
            problems.append(_missing(
                f"roles.{role}.model.path",
                f"set roles.{role}.model.path (a local directory or hub id) or roles.{role}.model.config (an inline architecture)",
            ))
    reward = roles.get("reward")
    data = recipe.get("data") or {}
    if reward and not reward.get("function") and reward.get("model") is None and not data.get("task") \
            and reward.get("judge") is None:  # roles.reward.judge scores without a function
        problems.append(_missing(
            "roles.reward.function",
            "set roles.reward.function (module:function), roles.reward.model, or data.task (its bundled reward)",
        ))
    if not data.get("train_files") and not data.get("task") and not data.get("tasks"):
        problems.append(_missing("data.train_files", "set data.train_files (a list of prompt files) or data.task (a bundled task)"))
    for key in ("train_files", "val_files"):
        for index, name in enumerate(data.get(key) or []):
            if not str(name).strip():
                problems.append(_missing(f"data.{key}[{index}]", "an empty file name"))
    if not recipe.get("resource_pools"):
        problems.append(_missing("resource_pools", "declare at least one pool, e.g. main: {process_on_nodes: [1]}"))
    return problems


# ---------------------------------------------------------------------------------- one layer's types
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


# ---------------------------------------------------------------------------------- choice lists from other packages
_DTYPES = ("float32", "fp32", "float16", "fp16", "half", "bfloat16", "bf16", "auto")
_KL_KIND_ALIASES = ("kl", "mse", "low_var_kl")


def _loss_agg_modes() -> tuple[str, ...]:
    return tuple(LOSS_AGG_MODES)


def _kl_kinds() -> tuple[str, ...]:
    return tuple(KL_KINDS) + _KL_KIND_ALIASES


def _tasks() -> tuple[str, ...]:
    # loads every bundled task: only when a task name is checked, off recipe loading's path
    from rlhfctl.tasks import task_names

    return tuple(task_names())


def _task_name_problem(name: str) -> str | None:
    # the task registry's rule: bundled names, and reasoning_gym:<dataset> names checked against reasoning-gym
    from rlhfctl.tasks import task_name_problem

    return task_name_problem(name)


def _task_name_pattern() -> str:
    from rlhfctl.tasks import task_name_pattern

    return task_name_pattern()


def _overlong() -> tuple[str, ...]:
    return tuple(OVERLONG_POLICIES)


_PROVIDERS: dict[str, Callable[[], tuple[str, ...]]] = {
    "dtypes": lambda: _DTYPES,
    "loss_agg_modes": _loss_agg_modes,
    "kl_kinds": _kl_kinds,
    "tasks": _tasks,
    "overlong": _overlong,
}


#: Providers whose listed choices are not all: a name outside the list is checked by its own rule (the problem, or
#: None) and, in the JSON Schema, matched by a pattern.
_OPEN_CHOICES: dict[str, tuple[Callable[[str], str | None], Callable[[], str]]] = {
    "tasks": (_task_name_problem, _task_name_pattern),
}


def choices_for(spec: tuple[str, ...] | str) -> tuple[str, ...]:
    """The allowed values for a field's ``choices`` metadata (a tuple, or a provider name)."""
    if isinstance(spec, str):
        return _PROVIDERS[spec]()
    return tuple(spec)


def choice_problem(spec: tuple[str, ...] | str, value: str) -> str | None:
    """Why ``value`` is not an allowed choice (listing the choices, and the closest one), or None."""
    if isinstance(spec, str) and spec in _OPEN_CHOICES:
        return _OPEN_CHOICES[spec][0](value)
    allowed = choices_for(spec)
    return None if value in allowed else f"{value!r} is not one of: {', '.join(allowed)}{did_you_mean(value, allowed)}"


def choice_pattern(spec: tuple[str, ...] | str) -> str | None:
    """The pattern of the values a provider accepts beyond its list (``reasoning_gym:<dataset>`` tasks), or None."""
    return _OPEN_CHOICES[spec][1]() if isinstance(spec, str) and spec in _OPEN_CHOICES else None
