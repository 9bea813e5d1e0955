"""Turn a recipe's pools and roles into worker groups: colocated roles share one process per rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlhfctl.recipe.importing import import_class
from rlhfctl.recipe.pools import DRIVER_POOL
from rlhfctl.recipe.resolve import ROLLOUT_ROLE, present_roles, rollout_pool
from rlhfctl.single_controller.host import torch_threads_for
from rlhfctl.single_controller import (
    LocalWorkerGroup,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerGroup,
)

@dataclass
class RoleGroups:
    """The worker group of each declared role, plus the pools they run on (for shutdown)."""

    groups: dict[str, WorkerGroup]
    pools: list[Any] = field(default_factory=list)

    def get(self, role: str) -> WorkerGroup | None:
        return self.groups.get(role)

    def __getitem__(self, role: str) -> WorkerGroup:
        return self.groups[role]

    def all(self) -> list[WorkerGroup]:
        return list(self.groups.values())

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


def cpu_threads_per_process(cfg: DictConfig, roles: dict[str, DictConfig], pool: str | None = None) -> int | None:
    """Torch threads per worker so every process on a single machine shares its cores without oversubscribing.

    A pool that reserves whole CPUs per process (``num_cpus_per_process: 1``) gets that many threads per
    process. Otherwise the processes of every pool in use are counted (each pool's first node holds its
    first processes) and the cores shared among them. None for clusters joined by address, where each
    node's own core count decides.
    """
    if cfg.ray.address:
        return None
    reserved = cfg.resource_pools[pool].get("num_cpus_per_process") if pool not in (None, DRIVER_POOL) else None
    if reserved is not None and float(reserved) >= 1:
        return int(reserved)
    used_pools = ({role_cfg.pool for role_cfg in roles.values()} | set(filter(None, [rollout_pool(cfg)]))) - {DRIVER_POOL}
    processes = sum(int(cfg.resource_pools[name].process_on_nodes[0]) for name in used_pools)
    return torch_threads_for(processes)


def build_role_groups(cfg: DictConfig, call_timeout_s: float | None = None) -> RoleGroups:
    """Create the pools and one group per role; roles sharing a pool are colocated."""
    recipe = OmegaConf.to_container(cfg, resolve=True)
    roles = {role: cfg.roles[role] for role in present_roles(cfg)}
    by_pool: dict[str, dict[str, Any]] = {}
    for role, role_cfg in roles.items():
        cls = import_class(role_cfg.worker, f"roles.{role}.worker")
        threads = cpu_threads_per_process(cfg, roles, role_cfg.pool)
        spec = RayClassWithInitArgs(cls, recipe, role).with_options(num_threads=threads)
        by_pool.setdefault(role_cfg.pool, {})[role] = spec
    pool_of_rollout = rollout_pool(cfg)
    if pool_of_rollout is not None:  # rollout.placement: separate, on a pool of its own
        spec = RayClassWithInitArgs(import_class(cfg.rollout.worker, "rollout.worker"), recipe, ROLLOUT_ROLE)
        threads = cpu_threads_per_process(cfg, roles, pool_of_rollout)
        by_pool.setdefault(pool_of_rollout, {})[ROLLOUT_ROLE] = spec.with_options(num_threads=threads)
    groups: dict[str, WorkerGroup] = {}
    pools: list[Any] = []
    local = cfg.ray.backend == "local"
    for pool_name, role_specs in by_pool.items():
        if pool_name == DRIVER_POOL:  # a reward function in this process: one rank, calls run when sent
            groups.update(LocalWorkerGroup.create_colocated(1, role_specs, call_timeout_s=call_timeout_s))
            continue
        pool_cfg = cfg.resource_pools[pool_name]
        pool = RayResourcePool(
            list(pool_cfg.process_on_nodes),
            use_gpu=bool(pool_cfg.use_gpu),
            max_colocate_count=int(pool_cfg.max_colocate_count),
            name=pool_name,
            num_cpus_per_process=pool_cfg.get("num_cpus_per_process"),
        )
        pools.append(pool)
        factory = LocalWorkerGroup if local else RayWorkerGroup
        groups.update(factory.create_colocated(pool, role_specs, call_timeout_s=call_timeout_s))
    return RoleGroups(groups=groups, pools=pools)
