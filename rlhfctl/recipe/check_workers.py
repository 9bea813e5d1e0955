"""Validation: every role's worker class imports and registers the methods the trainer calls."""

from __future__ import annotations

from typing import Any

from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.importing import import_callable, import_class
from rlhfctl.recipe.report import Issue, error
from rlhfctl.recipe.roles import present_roles, required_methods

__all__ = ["check_reward_function", "check_workers", "worker_classes"]


def worker_classes(cfg: Any) -> dict[str, type]:
    """Import each present role's worker class; RecipeError (naming roles.<role>.worker) on failure."""
    return {role: import_class(str(cfg.roles[role].worker), f"roles.{role}.worker") for role in present_roles(cfg)}


def check_workers(cfg: Any) -> list[Issue]:
    """Errors for worker classes that do not import or lack registered methods."""
    from rlhfctl.single_controller.decorator import registered_methods

    issues = []
    for role in present_roles(cfg):
        key = f"roles.{role}.worker"
        try:
            cls = import_class(str(cfg.roles[role].worker), key)
        except RecipeError as failure:
            issues.append(error(key, str(failure)))
            continue
        registered = registered_methods(cls)
        missing = [name for name in required_methods(cfg, role) if name not in registered]
        if not missing:
            continue
        plain = [name for name in missing if callable(getattr(cls, name, None))]
        why = f" ({', '.join(plain)} defined but not decorated with @register)" if plain else ""
        need = "as the reference (LoRA actor, no reference role)" if "compute_ref_log_prob" in missing and role == "actor" else f"as the {role}"
        issues.append(error(key, (
            f"{key}: {cls.__module__}.{cls.__qualname__} lacks registered method(s) {', '.join(missing)} needed {need}{why}; "
            f"registered: {', '.join(registered) or 'none'}"
        )))
    return issues


def check_reward_function(cfg: Any) -> list[Issue]:
    """An error when roles.reward.function does not import (the function is not called)."""
    reward = cfg.roles.get("reward")
    if reward is None or not reward.get("function"):
        return []
    try:
        import_callable(str(reward.function), "roles.reward.function")
    except RecipeError as failure:
        return [error("roles.reward.function", str(failure))]
    return []
