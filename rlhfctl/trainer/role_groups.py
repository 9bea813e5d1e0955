"""Turn a recipe's pools and roles into worker groups: colocated roles share one process per rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from rlhfctl.recipe.importing import import_class
from rlhfctl.recipe.pools import DRIVER_POOL
from rlhfctl.recipe.resolve import ROLLOUT_ROLE
from rlhfctl.recipe.resolved import resolve
from rlhfctl.recipe.specs import Recipe
from rlhfctl.single_controller.host import torch_threads_for
from rlhfctl.single_controller import (
    LocalWorkerGroup,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerGroup,
)
from rlhfctl.trainer.restarts import pool_needs, wait_for_resources

@dataclass
class RoleGroups:
    """The worker group of each declared role, plus the pools they run on (for shutdown)."""

    groups: dict[str, WorkerGroup]
    pools: list[Any] = field(default_factory=list)
    recipe: Recipe | None = None
    call_timeout_s: float | None = None

    def get(self, role: str) -> WorkerGroup | None:
        return self.groups.get(role)

    def __getitem__(self, role: str) -> WorkerGroup:
        return self.groups[role]

    def all(self) -> list[WorkerGroup]:
        return list(self.groups.values())

    def restart_rollout(self, wait_s: float) -> WorkerGroup:
        """Replace the rollout group (``rollout.placement: separate``) with fresh processes on its pool, the other
        groups untouched: stop it, release its pool, wait up to ``wait_s`` for the pool's resources, start and
        build the new one (it keeps the old one's observers); returns it."""
        old = self.groups[ROLLOUT_ROLE]
        pool_name = str(self.recipe.rollout.pool)
        old_pool = next((pool for pool in self.pools if getattr(pool, "name", None) == pool_name), None)
        try:
            old.shutdown()
        except Exception:  # noqa: BLE001 - the processes may be gone already
            pass
        if old_pool is not None:
            self.pools.remove(old_pool)
            old_pool.release()
            if not wait_for_resources(pool_needs([old_pool]), wait_s):
                raise RuntimeError(f"the rollout pool {pool_name}'s resources were not free again within {wait_s:g} s")
        built, pool = _groups_on_pool(self.recipe, pool_name, {ROLLOUT_ROLE: _rollout_spec(self.recipe)}, self.call_timeout_s)
        self.pools.append(pool)
        group = built[ROLLOUT_ROLE]
        group.observers.extend(old.observers)
        self.groups[ROLLOUT_ROLE] = group
        group.init_model()
        return group

    def shutdown(self) -> None:
        """Stop every worker process and release the placement groups."""
        for group in self.groups.values():
            try:
                group.shutdown()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        for pool in self.pools:
            release = getattr(pool, "release", None)
            if release is not None:
                release()


def cpu_threads_per_process(recipe: Recipe, pool: str | None = None) -> int | None:
    """Torch threads per worker so every process on a single machine shares its cores without oversubscribing.

    A pool that reserves whole CPUs per process (``num_cpus_per_process: 1``) gets that many threads per
    process. Otherwise the processes of every pool in use are counted (each pool's first node holds its
    first processes) and the cores shared among them. None for clusters joined by address, where each
    node's own core count decides.
    """
    if recipe.ray.address:
        return None
    reserved = recipe.resource_pools[pool].num_cpus_per_process if pool not in (None, DRIVER_POOL) else None
    if reserved is not None and float(reserved) >= 1:
        return int(reserved)
    used_pools = ({spec.pool for spec in recipe.roles.values()} | set(filter(None, [recipe.rollout.pool]))) - {DRIVER_POOL}
    processes = sum(int(recipe.resource_pools[name].process_on_nodes[0]) for name in used_pools)
    return torch_threads_for(processes)


def build_role_groups(recipe: Recipe | DictConfig, call_timeout_s: float | None = None) -> RoleGroups:
    """Create the pools and one group per role; roles sharing a pool are colocated. Every worker is constructed
    with the resolved recipe (an OmegaConf recipe is resolved first)."""
    recipe = recipe if isinstance(recipe, Recipe) else resolve(recipe)
    by_pool: dict[str, dict[str, Any]] = {}
    for role, spec in recipe.roles.items():
        cls = import_class(spec.worker, f"roles.{role}.worker")
        threads = cpu_threads_per_process(recipe, spec.pool)
        by_pool.setdefault(spec.pool, {})[role] = RayClassWithInitArgs(cls, recipe, role).with_options(num_threads=threads)
    if recipe.rollout.on_own_pool:  # rollout.placement: separate, on a pool of its own
        by_pool.setdefault(str(recipe.rollout.pool), {})[ROLLOUT_ROLE] = _rollout_spec(recipe)
    groups: dict[str, WorkerGroup] = {}
    pools: list[Any] = []
    for pool_name, role_specs in by_pool.items():
        if pool_name == DRIVER_POOL:  # a reward function in this process: one rank, calls run when sent
            groups.update(LocalWorkerGroup.create_colocated(1, role_specs, call_timeout_s=call_timeout_s))
            continue
        built, pool = _groups_on_pool(recipe, pool_name, role_specs, call_timeout_s)
        groups.update(built)
        pools.append(pool)
    return RoleGroups(groups=groups, pools=pools, recipe=recipe, call_timeout_s=call_timeout_s)


def _rollout_spec(recipe: Recipe) -> RayClassWithInitArgs:
    """The rollout group's worker (``rollout.worker``), with its pool's torch threads."""
    spec = RayClassWithInitArgs(import_class(recipe.rollout.worker, "rollout.worker"), recipe, ROLLOUT_ROLE)
    return spec.with_options(num_threads=cpu_threads_per_process(recipe, recipe.rollout.pool))


def _groups_on_pool(recipe: Recipe, pool_name: str, role_specs: dict[str, Any],
                    call_timeout_s: float | None) -> tuple[dict[str, WorkerGroup], Any]:
    """The pool ``resource_pools.<pool_name>`` and the colocated groups of ``role_specs`` on it."""
    pool_cfg = recipe.resource_pools[pool_name]
    pool = RayResourcePool(
        list(pool_cfg.process_on_nodes),
        use_gpu=bool(pool_cfg.use_gpu),
        max_colocate_count=int(pool_cfg.max_colocate_count),
        name=pool_name,
        num_cpus_per_process=pool_cfg.num_cpus_per_process,
    )
    factory = LocalWorkerGroup if recipe.ray.backend == "local" else RayWorkerGroup
    return factory.create_colocated(pool, role_specs, call_timeout_s=call_timeout_s), pool
