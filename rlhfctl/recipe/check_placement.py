"""Validation of where the rollout runs (``rollout.placement``) and how far ahead it may run (``trainer.max_staleness``).

With ``placement: separate`` a rollout worker group (role ``rollout``) generates on ``rollout.pool`` and
takes the actor's weights over a process group of its own. Every problem is an error (exit 2) naming its key:

- staleness needs a rollout group of its own (or partial rollouts, :mod:`rlhfctl.recipe.check_partial`);
- the rollout pool is declared, hosts no other role, uses GPUs exactly when the actor's pool does (the weight
  channel has one backend), and its ranks split each stream chunk evenly;
- ``rollout.worker`` imports and registers the methods the trainer calls on the group;
- the weight sync needs the Ray backend; the PPO loop is the only one with a rollout group.

Whether the rollout pool fits the machine is checked with the other pools (it is one of them in
:func:`rlhfctl.recipe.pools.resolve_pools`). :func:`check_staleness_correction` warns when samples of an older
policy are trained on with no off-policy correction (:mod:`rlhfctl.recipe.off_policy`).
"""

from __future__ import annotations

from collections.abc import Mapping

from rlhfctl.recipe.errors import Issue, RecipeError, did_you_mean, error, warning
from rlhfctl.recipe.importing import import_class
from rlhfctl.recipe.off_policy import CORRECTION_KEYS, off_policy_corrections, sample_age
from rlhfctl.recipe.pools import PoolInfo, pool_of
from rlhfctl.recipe.resolve import ROLLOUT_ROLE, required_methods
from rlhfctl.recipe.specs import Recipe

__all__ = ["check_placement", "check_staleness_correction"]


def check_placement(recipe: Recipe) -> list[Issue]:
    """Errors for staleness without a rollout group of its own, and for a rollout group that cannot run as placed."""
    separate = recipe.rollout.on_own_pool
    issues = _staleness(recipe, separate)
    if not separate:
        return issues
    name = str(recipe.algorithm.name)
    if name != "ppo":
        return [*issues, error("rollout.placement", (
            f"rollout.placement: separate starts a rollout group for the PPO loop, but algorithm.name is {name} "
            "(it generates nothing); remove rollout.placement or set it to colocated"))]
    if recipe.ray.backend == "local":
        issues.append(error("rollout.placement", (
            "rollout.placement: separate syncs weights with a collective between the actor's and the rollout "
            "group's processes, which ray.backend: local runs one call at a time in the driver; use ray.backend: ray")))
    issues += _worker_issues(recipe)
    pool_issues = _pool_issues(recipe.rollout.pool, recipe.pools)
    return issues + (pool_issues or _chunk_issues(recipe, recipe.pools[str(recipe.rollout.pool)]))


def check_staleness_correction(recipe: Recipe) -> list[Issue]:
    """A warning when the rollout group runs ahead (``trainer.max_staleness`` >= 1 with ``rollout.placement: separate``)
    and no key adds an off-policy correction: the update would weigh old samples as the current policy's."""
    age = sample_age(recipe)
    if age <= 0 or off_policy_corrections(recipe):
        return []
    versions = f"{age} policy version{'s' if age != 1 else ''}"
    why = "rollout.placement: separate" if recipe.rollout.on_own_pool else "rollout.partial"
    return [warning("trainer.max_staleness", (
        f"trainer.max_staleness: {age} with {why} trains the actor on samples up to {versions} "
        "old, and no off-policy correction is set, so the update weighs them as if the current policy had sampled "
        f"them; add one: {' or '.join(CORRECTION_KEYS)}; or set trainer.max_staleness: 0"))]


def _staleness(recipe: Recipe, separate: bool) -> list[Issue]:
    """trainer.max_staleness > 0 needs a rollout group of its own, or partial rollouts (their carried samples age)."""
    staleness = recipe.rollout.max_staleness
    if staleness <= 0:
        return []
    issues = []
    if not separate and recipe.rollout.partial_budget is None:
        issues.append(error("trainer.max_staleness", (
            f"trainer.max_staleness: {staleness} lets the rollout run ahead of the actor, but with rollout.placement: "
            "colocated the actor's ranks generate in turn with the update; set rollout.placement: separate and "
            "rollout.pool, or max_staleness: 0")))
    return issues


def _pool_issues(named: str | None, pools: Mapping[str, PoolInfo]) -> list[Issue]:
    """The rollout pool (``named``) is declared and hosts no other role."""
    declared = [pool.name for pool in pools.values() if not pool.in_driver]
    if named is None or str(named) not in declared:
        what = "is null" if named is None else f"names {str(named)!r}, which is not declared in resource_pools"
        hint = "" if named is None else did_you_mean(str(named), declared)
        return [error("rollout.pool", (
            f"rollout.pool: {what}; rollout.placement: separate needs a pool of resource_pools for the rollout group "
            f"(declared: {', '.join(declared) or 'none'}){hint}"))]
    pool = pools[str(named)]
    others = [role for role in pool.roles if role != ROLLOUT_ROLE]
    if others:
        return [error("rollout.pool", (
            f"rollout.pool: {pool.name} also hosts {', '.join(others)} (roles.{others[0]}.pool); the rollout group "
            "needs its pool to itself, or its calls would queue behind the other role's; declare a pool for it"))]
    return _device_issues(pool, pool_of(pools, "actor"))


def _device_issues(rollout: PoolInfo, actor: PoolInfo | None) -> list[Issue]:
    """The weight channel joins the actor's rank 0 and the rollout ranks with one backend: both on GPUs or both on CPUs."""
    if actor is None or actor.use_gpu == rollout.use_gpu:
        return []
    where = {True: "GPUs", False: "CPUs"}
    return [error("rollout.pool", (
        f"rollout.pool: {rollout.name} runs on {where[rollout.use_gpu]} (use_gpu: {str(rollout.use_gpu).lower()}) but "
        f"the actor's pool {actor.name} on {where[actor.use_gpu]}; the weight channel between them is one process "
        "group (NCCL on GPUs, gloo on CPUs), so set resource_pools.<pool>.use_gpu the same on both pools"))]


def _worker_issues(recipe: Recipe) -> list[Issue]:
    """rollout.worker imports and registers the rollout group's methods."""
    from rlhfctl.single_controller.decorator import registered_methods  # pulls in torch: only when the check runs

    try:
        cls = import_class(recipe.rollout.worker, "rollout.worker")
    except RecipeError as failure:
        return [error("rollout.worker", str(failure))]
    missing = [name for name in required_methods(recipe.sections, ROLLOUT_ROLE) if name not in registered_methods(cls)]
    if not missing:
        return []
    return [error("rollout.worker", (
        f"rollout.worker: {cls.__module__}.{cls.__qualname__} lacks registered method(s) {', '.join(missing)} "
        "needed as the rollout group; subclass workers.rollout_worker.RolloutWorker or decorate them with @register"))]


def _chunk_issues(recipe: Recipe, pool: PoolInfo) -> list[Issue]:
    """Each stream chunk's prompts split evenly over the rollout ranks."""
    prompts, chunks = recipe.step.prompts_per_step, int(recipe.rollout.settings.stream_chunks)
    if prompts % (chunks * pool.world_size) == 0:
        return []
    return [error("rollout.stream_chunks", (
        f"rollout.stream_chunks: trainer.batch_size {prompts} is not divisible by stream_chunks {chunks} x "
        f"{pool.world_size} rollout rank(s) (pool {pool.name}); each chunk's prompts are split over the rollout "
        f"ranks, so choose stream_chunks and the pool size so their product divides {prompts}"))]
