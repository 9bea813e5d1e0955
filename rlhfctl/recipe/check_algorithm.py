"""Validation: what each algorithm needs. PPO: the advantage estimator exists and has what it needs, KL has
a reference, sampling is sane. sft, reward_model and dpo recipes: the trained role, its worker, the
reference, data and lengths."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

from rlhfctl.recipe.check_runtime import check_data, check_model, check_pools, check_resume, check_strategies, unregistered_methods
from rlhfctl.recipe.errors import Issue, RecipeError, did_you_mean, error, warning
from rlhfctl.recipe.importing import ensure_cwd_importable
from rlhfctl.recipe.resolve import uses_kl
from rlhfctl.recipe.resolved import resolve
from rlhfctl.recipe.schema import ROLE_NAMES, ActorRole, RecipeSchema
from rlhfctl.recipe.specs import Recipe
from rlhfctl.recipe.stages import STAGES, stage_roles
from rlhfctl.tasks import UnknownTaskError, get_task

__all__ = ["check_algorithm", "check_stage"]

def check_algorithm(recipe: Recipe) -> list[Issue]:
    """Errors and warnings about algorithm.*, the roles it needs, and rollout sampling."""
    issues = _import_modules(recipe)
    issues += _estimator(recipe)
    issues += _policy_loss(recipe)
    issues += _named_rewards(recipe)
    issues += _dynamic_sampling(recipe)
    issues += _kl(recipe)
    issues += _sampling(recipe)
    return issues


def _import_modules(recipe: Recipe) -> list[Issue]:
    ensure_cwd_importable()
    issues = []
    for index, name in enumerate(recipe.algorithm.import_modules):
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


def _estimator(recipe: Recipe) -> list[Issue]:
    from rlhfctl.algorithms import ADVANTAGE_ESTIMATORS  # the registries pull in torch: only when the check runs

    name = str(recipe.algorithm.adv_estimator)
    key = "algorithm.adv_estimator"
    if name not in ADVANTAGE_ESTIMATORS:
        return [_not_registered(key, name, ADVANTAGE_ESTIMATORS, "estimators")]
    params = inspect.signature(ADVANTAGE_ESTIMATORS[name]).parameters
    has_critic = recipe.step.has_critic
    issues = []
    values = params.get("values")
    if values is not None and values.default is inspect.Parameter.empty and not has_critic:
        issues.append(error(key, f"{key}: {name} needs value estimates: add a critic role (roles.critic)"))
    if has_critic and values is None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        issues.append(warning("roles.critic", f"roles.critic: the critic is trained but {name} does not use values; use gae or remove the critic"))
    if "index" in params and int(recipe.rollout.settings.n) == 1:
        issues.append(warning("rollout.n", f"rollout.n: 1 response per prompt gives {name} groups of one (no baseline); use n >= 2"))
    return issues


def _policy_loss(recipe: Recipe) -> list[Issue]:
    """The actor's policy loss is registered, and no loss-specific setting is given to a loss that ignores it."""
    # the loss registry pulls in torch: only when the check runs
    from rlhfctl.algorithms import POLICY_LOSSES
    from rlhfctl.algorithms.policy_losses import policy_loss_keys

    actor = recipe.sections.roles.actor
    if actor is None:
        return []
    name = str(actor.policy_loss)
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
    if actor.loss_scale_factor is not None and str(actor.loss_agg_mode) != "seq-mean-token-sum-norm":
        issues.append(error("roles.actor.loss_scale_factor", (
            "roles.actor.loss_scale_factor: only loss_agg_mode seq-mean-token-sum-norm divides by it; "
            "remove it or set roles.actor.loss_agg_mode=seq-mean-token-sum-norm"
        )))
    return issues


def _named_rewards(recipe: Recipe) -> list[Issue]:
    """gdpo has named rewards to normalize, and its keys and weights are given only to gdpo, one weight per key."""
    algo = recipe.algorithm
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


def _dynamic_sampling(recipe: Recipe) -> list[Issue]:
    """DAPO's group filter needs groups; the overlong buffer fits inside the response budget."""
    from rlhfctl.algorithms.overlong import overlong_buffer_problem  # pulls in torch: only when the check runs

    issues = []
    if recipe.algorithm.filter_groups.enable and int(recipe.rollout.settings.n) == 1:
        issues.append(error("algorithm.filter_groups.enable", (
            "algorithm.filter_groups.enable: with rollout.n=1 every group has one response, so no group can be told "
            "apart from another; set rollout.n >= 2 (DAPO uses 16) or turn the filter off"
        )))
    reward = recipe.sections.roles.reward
    buffer = None if reward is None else reward.overlong_buffer
    if buffer is not None and buffer.enable:
        problem = overlong_buffer_problem(buffer, recipe.rollout.response_width)
        if problem:
            issues.append(error("roles.reward.overlong_buffer.len", problem))
    return issues


def _kl(recipe: Recipe) -> list[Issue]:
    kl = recipe.algorithm.kl
    uses = uses_kl(recipe.sections)
    issues = []
    if uses and recipe.step.reference_source is None:
        key = "algorithm.kl.use_kl_loss" if kl.use_kl_loss else "algorithm.kl.use_in_reward"
        issues.append(error(key, f"{key}: the KL term needs a reference policy: set roles.reference (or give the actor a LoRA adapter)"))
    if recipe.has("reference") and not uses:
        issues.append(warning("roles.reference", (
            "roles.reference: reference log-probs are computed every step but no KL term uses them; "
            "set algorithm.kl.use_kl_loss or use_in_reward, or roles.reference=null"
        )))
    if kl.controller == "adaptive" and not kl.use_in_reward:
        issues.append(warning("algorithm.kl.controller", "algorithm.kl.controller: the adaptive controller only scales the in-reward KL (use_in_reward is false)"))
    return issues


def _sampling(recipe: Recipe) -> list[Issue]:
    rollout = recipe.rollout.settings
    issues = []
    if rollout.do_sample and rollout.temperature == 0:
        issues.append(error("rollout.temperature", "rollout.temperature: 0 with do_sample true; for greedy decoding set rollout.do_sample=false"))
    if not rollout.do_sample and rollout.n > 1:
        issues.append(warning("rollout.do_sample", (
            f"rollout.do_sample: greedy decoding makes the {rollout.n} responses of a prompt identical (zero group advantages)"
        )))
    return issues


# ---------------------------------------------------------------------------------- sft, reward_model, dpo
def stage_recipe(recipe: Recipe) -> Recipe | None:
    """The resolved recipe of the roles a supervised stage starts (the others null), on the pools they use; None when
    the trained role has no model (:func:`check_stage` says so)."""
    if _trained_role(recipe, STAGES[str(recipe.stage)].trained_role, str(recipe.stage)):
        return None
    return resolve(_only_roles(recipe.sections, stage_roles(recipe.sections)))


def check_stage(recipe: Recipe) -> list[Issue]:
    """Every problem of a supervised stage's recipe (errors name their key)."""
    name = str(recipe.stage)
    spec = STAGES[name]
    issues = _trained_role(recipe, spec.trained_role, name)
    if issues:
        return issues
    roles = stage_roles(recipe.sections)
    started = stage_recipe(recipe)
    issues += check_pools(started)
    issues += _workers(recipe, roles, spec.trained_role, spec.worker, name)
    issues += _reference(recipe, name)
    issues += [issue for issue in check_data(recipe) if issue.key_path != "trainer.val_every"]
    issues += _task_data(recipe, spec.record_kind, name)
    issues += _evaluation(recipe)
    issues += _models(recipe, roles)
    issues += check_resume(recipe)
    issues += _shards(recipe, spec.trained_role)
    issues += check_strategies(started)
    return issues


def _only_roles(sections: RecipeSchema, keep: dict[str, tuple[str, ...]]) -> RecipeSchema:
    """The recipe's sections with every role outside ``keep`` null: the roles the stage does not start."""
    left_out = {role: None for role in ROLE_NAMES if role not in keep}
    return dataclasses.replace(sections, roles=dataclasses.replace(sections.roles, **left_out))


def _trained_role(recipe: Recipe, role: str, name: str) -> list[Issue]:
    key = f"roles.{role}"
    section = recipe.section_of(role)
    if section is None:
        return [error(key, f"{key}: algorithm.name={name} trains this role; it must not be null")]
    if section.get("model") is None:
        return [error(f"{key}.model", (
            f"{key}.model: algorithm.name={name} trains this role's model; set {key}.model.config (an inline "
            f"architecture) or {key}.model.path (e.g. an earlier stage's model)"
        ))]
    return []


def _workers(recipe: Recipe, roles: dict[str, tuple[str, ...]], trained: str, default: str, name: str) -> list[Issue]:
    issues = []
    for role, needed in roles.items():
        key = f"roles.{role}.worker"
        try:
            cls, missing = unregistered_methods(recipe, role, needed)
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


def _reference(recipe: Recipe, name: str) -> list[Issue]:
    if name != "dpo" or recipe.step.reference_source is not None:
        return []
    return [error("roles.reference", (
        "roles.reference: dpo compares the policy with a frozen reference; keep roles.reference (the initial "
        "policy) or give the actor a LoRA adapter (roles.actor.lora) so its adapter-disabled weights serve"
    ))]


def _task_data(recipe: Recipe, kind: str, name: str) -> list[Issue]:
    data = recipe.data
    if data.train_files or not data.task:
        return []
    try:
        task = get_task(str(data.task))
    except UnknownTaskError:
        return []  # check_data reports it
    attribute = "make_demonstrations" if kind == "demonstrations" else "make_preferences"
    if getattr(task, attribute, None) is None:
        return [error("data.task", f"data.task: the {data.task!r} task has no {kind} for algorithm.name={name}; set data.train_files")]
    return []


def _evaluation(recipe: Recipe) -> list[Issue]:
    data = recipe.data
    has_eval = bool(data.val_files) or (bool(data.train_files) and data.eval_fraction > 0) or (
        not data.train_files and bool(data.task) and data.num_val > 0
    )
    if recipe.trainer.val_every and not has_eval:
        return [warning("trainer.val_every", (
            "trainer.val_every: there is nothing to evaluate on; set data.val_files or data.eval_fraction"
        ))]
    return []


def _models(recipe: Recipe, roles: dict[str, tuple[str, ...]]) -> list[Issue]:
    # The models as written (the reference's null: the actor's), not RoleSpec.model: that fills in the default
    # inline architecture, whose positions this check would then measure where the recipe gives none.
    actor = recipe.section_of("actor")
    issues = []
    for role in roles:
        model = recipe.section_of(role).get("model") or (actor.model if role == "reference" and actor is not None else None)
        if model is not None:
            issues += check_model(role, model, int(recipe.data.max_length), "data.max_length")
    return issues


def _shards(recipe: Recipe, role: str) -> list[Issue]:
    world = recipe.role(role).world_size
    batch_size = int(recipe.trainer.batch_size)
    if world is None or world <= 1 or batch_size % world == 0:
        return []
    return [warning("trainer.batch_size", (
        f"trainer.batch_size: {batch_size} examples do not split evenly over the {world} ranks of "
        f"roles.{role}; the rows repeated as padding count twice in each step"
    ))]
