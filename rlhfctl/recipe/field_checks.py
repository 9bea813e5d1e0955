"""Per-field checks on a merged recipe: allowed choices, numeric bounds, and values that are required."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rlhfctl.recipe.choices import choices_for
from rlhfctl.recipe.errors import RecipeError, did_you_mean
from rlhfctl.recipe.typespec import ROOT, TypeSpec, format_path, struct_fields
from rlhfctl.recipe.typecheck import show_value

__all__ = ["check_fields"]

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
        allowed = choices_for(metadata["choices"])
        if value not in allowed:
            problems.append(RecipeError(
                f"{path}: {value!r} is not one of: {', '.join(allowed)}{did_you_mean(value, allowed)}",
                key_path=path,
                kind="bad_choice",
            ))
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
    if roles.get("reward") is None and stage in ("ppo", "reward_model"):
        problems.append(_missing("roles.reward", "every recipe needs a reward role (a function or a reward model)"))
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
    if reward and not reward.get("function") and reward.get("model") is None and not data.get("task"):
        problems.append(_missing(
            "roles.reward.function",
            "set roles.reward.function (module:function), roles.reward.model, or data.task (its bundled reward)",
        ))
    if not data.get("train_files") and not data.get("task"):
        problems.append(_missing("data.train_files", "set data.train_files (a list of prompt files) or data.task (a bundled task)"))
    for key in ("train_files", "val_files"):
        for index, name in enumerate(data.get(key) or []):
            if not str(name).strip():
                problems.append(_missing(f"data.{key}[{index}]", "an empty file name"))
    if not recipe.get("resource_pools"):
        problems.append(_missing("resource_pools", "declare at least one pool, e.g. main: {process_on_nodes: [1]}"))
    return problems
