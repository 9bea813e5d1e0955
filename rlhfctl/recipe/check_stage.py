"""Validation of sft, reward_model and dpo recipes: the trained role, its worker, the reference, data and lengths."""

from __future__ import annotations

from typing import Any

from rlhfctl.recipe.check_data import check_data
from rlhfctl.recipe.check_runtime import check_model, check_pools, check_resume, check_strategies
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.importing import import_class
from rlhfctl.recipe.pools import PoolInfo
from rlhfctl.recipe.report import Issue, error, warning
from rlhfctl.recipe.stages import STAGES, only_roles, stage_roles

__all__ = ["check_stage"]


def check_stage(cfg: Any) -> tuple[dict[str, PoolInfo], list[Issue]]:
    """The pools of the roles the stage starts, and every problem found (errors name their key)."""
    name = str(cfg.algorithm.name)
    spec = STAGES[name]
    issues = _trained_role(cfg, spec.trained_role, name)
    if issues:
        return {}, issues
    roles = stage_roles(cfg)
    pools, pool_issues = check_pools(only_roles(cfg, roles))
    issues += pool_issues
    issues += _workers(cfg, roles, spec.trained_role, spec.worker, name)
    issues += _reference(cfg, name)
    issues += [issue for issue in check_data(cfg) if issue.key_path != "trainer.val_every"]
    issues += _task_data(cfg, spec.record_kind, name)
    issues += _evaluation(cfg)
    issues += _models(cfg, roles)
    issues += check_resume(cfg)
    issues += _shards(cfg, pools, spec.trained_role)
    issues += check_strategies(only_roles(cfg, roles), pools)
    return pools, issues


def _trained_role(cfg: Any, role: str, name: str) -> list[Issue]:
    key = f"roles.{role}"
    section = cfg.roles.get(role)
    if section is None:
        return [error(key, f"{key}: algorithm.name={name} trains this role; it must not be null")]
    if section.get("model") is None:
        return [error(f"{key}.model", (
            f"{key}.model: algorithm.name={name} trains this role's model; set {key}.model.config (an inline "
            f"architecture) or {key}.model.path (e.g. an earlier stage's model)"
        ))]
    return []


def _workers(cfg: Any, roles: dict[str, tuple[str, ...]], trained: str, default: str, name: str) -> list[Issue]:
    from rlhfctl.single_controller.decorator import registered_methods

    issues = []
    for role, needed in roles.items():
        key = f"roles.{role}.worker"
        try:
            cls = import_class(str(cfg.roles[role].worker), key)
        except RecipeError as failure:
            issues.append(error(key, str(failure)))
            continue
        registered = registered_methods(cls)
        missing = [method for method in needed if method not in registered]
        if missing:
            hint = f"; use roles.{role}.worker: {default}" if role == trained else ""
            issues.append(error(key, (
                f"{key}: {cls.__module__}.{cls.__qualname__} lacks registered method(s) {', '.join(missing)} needed by "
                f"algorithm.name={name}{hint}"
            )))
    return issues


def _reference(cfg: Any, name: str) -> list[Issue]:
    if name != "dpo" or "reference" in stage_roles(cfg) or cfg.roles.actor.get("lora") is not None:
        return []
    return [error("roles.reference", (
        "roles.reference: dpo compares the policy with a frozen reference; keep roles.reference (the initial "
        "policy) or give the actor a LoRA adapter (roles.actor.lora) so its adapter-disabled weights serve"
    ))]


def _task_data(cfg: Any, kind: str, name: str) -> list[Issue]:
    if cfg.data.train_files or not cfg.data.task:
        return []
    from rlhfctl.tasks import UnknownTaskError, get_task

    try:
        task = get_task(str(cfg.data.task))
    except UnknownTaskError:
        return []  # check_data reports it
    attribute = "make_demonstrations" if kind == "demonstrations" else "make_preferences"
    if getattr(task, attribute, None) is None:
        return [error("data.task", f"data.task: the {cfg.data.task!r} task has no {kind} for algorithm.name={name}; set data.train_files")]
    return []


def _evaluation(cfg: Any) -> list[Issue]:
    data = cfg.data
    has_eval = bool(data.val_files) or (bool(data.train_files) and data.eval_fraction > 0) or (
        not data.train_files and bool(data.task) and data.num_val > 0
    )
    if cfg.trainer.val_every and not has_eval:
        return [warning("trainer.val_every", (
            "trainer.val_every: there is nothing to evaluate on; set data.val_files or data.eval_fraction"
        ))]
    return []


def _models(cfg: Any, roles: dict[str, tuple[str, ...]]) -> list[Issue]:
    issues = []
    for role in roles:
        model = cfg.roles[role].get("model") or (cfg.roles.actor.get("model") if role == "reference" else None)
        if model is not None:
            issues += check_model(role, model, int(cfg.data.max_length), "data.max_length")
    return issues


def _shards(cfg: Any, pools: dict[str, PoolInfo], role: str) -> list[Issue]:
    pool = pools.get(str(cfg.roles[role].pool))
    if pool is None or pool.world_size <= 1 or cfg.trainer.batch_size % pool.world_size == 0:
        return []
    return [warning("trainer.batch_size", (
        f"trainer.batch_size: {cfg.trainer.batch_size} examples do not split evenly over the {pool.world_size} ranks of "
        f"roles.{role}; the rows repeated as padding count twice in each step"
    ))]
