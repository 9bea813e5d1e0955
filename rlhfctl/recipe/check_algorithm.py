"""Validation: what each algorithm needs. PPO: the advantage estimator exists and has what it needs, KL has
a reference, sampling is sane. sft, reward_model and dpo recipes: the trained role, its worker, the
reference, data and lengths."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from rlhfctl.recipe.check_runtime import check_data, check_model, check_pools, check_resume, check_strategies, unregistered_methods
from rlhfctl.recipe.errors import Issue, RecipeError, did_you_mean, error, warning
from rlhfctl.recipe.importing import ensure_cwd_importable
from rlhfctl.recipe.pools import PoolInfo
from rlhfctl.recipe.resolve import reference_source, uses_kl
from rlhfctl.recipe.stages import STAGES, only_roles, stage_roles

__all__ = ["check_algorithm", "check_stage"]

def check_algorithm(cfg: Any) -> list[Issue]:
    """Errors and warnings about algorithm.*, the roles it needs, and rollout sampling."""
    issues = _import_modules(cfg)
    issues += _estimator(cfg)
    issues += _policy_loss(cfg)
    issues += _named_rewards(cfg)
    issues += _dynamic_sampling(cfg)
    issues += _kl(cfg)
    issues += _sampling(cfg)
    return issues


def _import_modules(cfg: Any) -> list[Issue]:
    ensure_cwd_importable()
    issues = []
    for index, name in enumerate(cfg.algorithm.import_modules):
        key = f"algorithm.import_modules[{index}]"
        try:
            importlib.import_module(str(name))
        except (Exception, SystemExit) as failure:  # user code may fail in any way at import time
            detail = str(failure).splitlines()[0] if str(failure) else ""
            issues.append(error(key, f"{key}: cannot import {name!r}: {type(failure).__name__}: {detail}"))
    return issues


def _not_registered(key: str, name: str, registry: Any, kind: str) -> Issue:
    """The error for a name no registry entry has: the registered names, a "did you mean", and where custom ones go."""
    known = sorted(registry)
    return error(key, (
        f"{key}: {name!r} is not one of: {', '.join(known)}{did_you_mean(name, known)} "
        f"(custom {kind}: register them in a module listed in algorithm.import_modules)"
    ))


def _estimator(cfg: Any) -> list[Issue]:
    from rlhfctl.algorithms import ADVANTAGE_ESTIMATORS

    name = str(cfg.algorithm.adv_estimator)
    key = "algorithm.adv_estimator"
    if name not in ADVANTAGE_ESTIMATORS:
        return [_not_registered(key, name, ADVANTAGE_ESTIMATORS, "estimators")]
    params = inspect.signature(ADVANTAGE_ESTIMATORS[name]).parameters
    has_critic = cfg.roles.get("critic") is not None
    issues = []
    values = params.get("values")
    if values is not None and values.default is inspect.Parameter.empty and not has_critic:
        issues.append(error(key, f"{key}: {name} needs value estimates: add a critic role (roles.critic)"))
    if has_critic and values is None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        issues.append(warning("roles.critic", f"roles.critic: the critic is trained but {name} does not use values; use gae or remove the critic"))
    if "index" in params and int(cfg.rollout.n) == 1:
        issues.append(warning("rollout.n", f"rollout.n: 1 response per prompt gives {name} groups of one (no baseline); use n >= 2"))
    return issues


def _policy_loss(cfg: Any) -> list[Issue]:
    """The actor's policy loss is registered, and no loss-specific setting is given to a loss that ignores it."""
    from rlhfctl.algorithms import POLICY_LOSSES
    from rlhfctl.algorithms.policy_losses import policy_loss_keys, policy_loss_takes_behaviour
    from rlhfctl.recipe.schema import ActorRole

    actor = cfg.roles.get("actor")
    if actor is None:
        return []
    name = str(actor.get("policy_loss") or "vanilla")
    key = "roles.actor.policy_loss"
    if name not in POLICY_LOSSES:
        return [_not_registered(key, name, POLICY_LOSSES, "losses")]
    used = set(policy_loss_keys(name))
    # The settings only some losses read default to null: one set for a loss that does not read it is a mistake.
    fields = ActorRole.__dataclass_fields__
    optional = {k for n in POLICY_LOSSES for k in policy_loss_keys(n) if k in fields and fields[k].default is None}
    issues = [
        error(f"roles.actor.{setting}", (
            f"roles.actor.{setting}: policy_loss {name} does not use it; remove it, or choose a loss that does "
            f"({', '.join(sorted(n for n in POLICY_LOSSES if setting in policy_loss_keys(n)))})"
        ))
        for setting in sorted(optional - used) if actor.get(setting) is not None
    ]
    # The actor's own rule (policy_loss_takes_behaviour), so a custom loss that takes the behaviour log-probs is
    # refused here as it would be at its first update, not only decoupled_ppo by name.
    if policy_loss_takes_behaviour(name) and cfg.rollout.get("importance_cap") is not None:
        issues.append(error("rollout.importance_cap", (
            f"rollout.importance_cap: policy_loss {name} takes the behaviour log-probs and weighs each token by "
            "proximal / behaviour probability already; truncated importance sampling would weigh it twice. Remove "
            "it (decoupled_ppo caps the weight with roles.actor.behav_imp_weight_cap) or use another policy loss"
        )))
    if actor.get("loss_scale_factor") is not None and str(actor.loss_agg_mode) != "seq-mean-token-sum-norm":
        issues.append(error("roles.actor.loss_scale_factor", (
            "roles.actor.loss_scale_factor: only loss_agg_mode seq-mean-token-sum-norm divides by it; "
            "remove it or set roles.actor.loss_agg_mode=seq-mean-token-sum-norm"
        )))
    return issues


def _named_rewards(cfg: Any) -> list[Issue]:
    """gdpo has named rewards to normalize, and its keys and weights are given only to gdpo, one weight per key."""
    algo = cfg.algorithm
    name, keys, weights = str(algo.adv_estimator), list(algo.gdpo_reward_keys), algo.gdpo_reward_weights
    if name != "gdpo":
        given = [key for key, value in (("gdpo_reward_keys", keys), ("gdpo_reward_weights", weights)) if value]
        return [error(f"algorithm.{key}", (
            f"algorithm.{key}: only adv_estimator gdpo reads it (the estimator is {name}); remove it or set "
            "algorithm.adv_estimator=gdpo"
        )) for key in given]
    if not keys:
        return [error("algorithm.gdpo_reward_keys", (
            "algorithm.gdpo_reward_keys: gdpo normalizes each named reward within its group; list the names your "
            "reward function returns in its dict per sample (e.g. [acc, format]; rlhfctl.rewards:combined gives them)"
        ))]
    if weights is not None and len(weights) != len(keys):
        return [error("algorithm.gdpo_reward_weights", (
            f"algorithm.gdpo_reward_weights: {len(weights)} weights for {len(keys)} gdpo_reward_keys; give one per key"
        ))]
    return []


def _dynamic_sampling(cfg: Any) -> list[Issue]:
    """DAPO's group filter needs groups; the overlong buffer fits inside the response budget."""
    from rlhfctl.agents.trajectory import response_width
    from rlhfctl.algorithms.overlong import overlong_buffer_problem

    issues = []
    if cfg.algorithm.filter_groups.enable and int(cfg.rollout.n) == 1:
        issues.append(error("algorithm.filter_groups.enable", (
            "algorithm.filter_groups.enable: with rollout.n=1 every group has one response, so no group can be told "
            "apart from another; set rollout.n >= 2 (DAPO uses 16) or turn the filter off"
        )))
    reward = cfg.roles.get("reward")
    buffer = None if reward is None else reward.get("overlong_buffer")
    if buffer is not None and buffer.enable:
        problem = overlong_buffer_problem(buffer, response_width(cfg.rollout))
        if problem:
            issues.append(error("roles.reward.overlong_buffer.len", problem))
    return issues


def _kl(cfg: Any) -> list[Issue]:
    kl = cfg.algorithm.kl
    issues = []
    if uses_kl(cfg) and reference_source(cfg) is None:
        key = "algorithm.kl.use_kl_loss" if kl.use_kl_loss else "algorithm.kl.use_in_reward"
        issues.append(error(key, f"{key}: the KL term needs a reference policy: set roles.reference (or give the actor a LoRA adapter)"))
    if cfg.roles.get("reference") is not None and not uses_kl(cfg):
        issues.append(warning("roles.reference", (
            "roles.reference: reference log-probs are computed every step but no KL term uses them; "
            "set algorithm.kl.use_kl_loss or use_in_reward, or roles.reference=null"
        )))
    if kl.controller == "adaptive" and not kl.use_in_reward:
        issues.append(warning("algorithm.kl.controller", "algorithm.kl.controller: the adaptive controller only scales the in-reward KL (use_in_reward is false)"))
    return issues


def _sampling(cfg: Any) -> list[Issue]:
    rollout = cfg.rollout
    issues = []
    if rollout.do_sample and rollout.temperature == 0:
        issues.append(error("rollout.temperature", "rollout.temperature: 0 with do_sample true; for greedy decoding set rollout.do_sample=false"))
    if not rollout.do_sample and rollout.n > 1:
        issues.append(warning("rollout.do_sample", (
            f"rollout.do_sample: greedy decoding makes the {rollout.n} responses of a prompt identical (zero group advantages)"
        )))
    return issues


# ---------------------------------------------------------------------------------- sft, reward_model, dpo
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
    issues = []
    for role, needed in roles.items():
        key = f"roles.{role}.worker"
        try:
            cls, missing = unregistered_methods(cfg, role, needed)
        except RecipeError as failure:
            issues.append(error(key, str(failure)))
            continue
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
