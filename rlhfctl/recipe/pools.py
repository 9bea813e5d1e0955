"""Resource pools as the recipe declares them: size, GPUs, and which roles share (are colocated on) each.

The rollout worker group (``rollout.placement: separate``) is a role here like the others, named
``rollout`` on ``rollout.pool``, so every check of the pools that are started counts it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rlhfctl.recipe.errors import RecipeError, did_you_mean
from rlhfctl.recipe.resolve import ROLLOUT_ROLE, present_roles, rollout_pool

__all__ = ["DRIVER_POOL", "PoolInfo", "pool_key", "pool_of", "pool_shares", "resolve_pools"]

DRIVER_POOL = "driver"
"""``roles.reward.pool: driver`` runs a reward function in the driver process: no worker process, and no
Ray hand-over between generation and scoring (rule-based rewards are cheap; a reward model needs a pool)."""


@dataclass(frozen=True)
class PoolInfo:
    """One pool: its processes, GPU use, and the roles colocated on it (one process per rank hosts them all)."""

    name: str
    roles: tuple[str, ...]
    process_on_nodes: tuple[int, ...]
    use_gpu: bool
    max_colocate_count: int
    num_cpus_per_process: float | None
    in_driver: bool = False

    @property
    def world_size(self) -> int:
        """Ranks in the pool (sum of process_on_nodes)."""
        return sum(self.process_on_nodes)

    @property
    def gpus(self) -> int:
        """GPUs the pool reserves."""
        return self.world_size if self.use_gpu else 0

    @property
    def role_keys(self) -> tuple[str, ...]:
        """The recipe keys that put each of its roles here (``roles.actor.pool``, ``rollout.pool``)."""
        return tuple(pool_key(role) for role in self.roles)

    @property
    def colocated(self) -> bool:
        """True when several roles share the pool's processes."""
        return len(self.roles) > 1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "name": self.name,
            "roles": list(self.roles),
            "world_size": self.world_size,
            "process_on_nodes": list(self.process_on_nodes),
            "use_gpu": self.use_gpu,
            "gpus": self.gpus,
            "max_colocate_count": self.max_colocate_count,
            "num_cpus_per_process": self.num_cpus_per_process,
            "in_driver": self.in_driver,
        }


def resolve_pools(cfg: Any, strict: bool = True) -> dict[str, PoolInfo]:
    """Per declared pool (in recipe order): its roles, world size and GPU use.

    With ``strict`` a role naming an undeclared pool raises RecipeError; otherwise that role is left out.
    """
    members: dict[str, list[str]] = {name: [] for name in cfg.resource_pools}
    in_driver: list[str] = []
    for role in present_roles(cfg):
        pool = cfg.roles[role].pool
        if pool in members:
            members[pool].append(role)
        elif pool == DRIVER_POOL:
            in_driver.append(role)
        elif strict:
            declared = list(members)
            raise RecipeError(
                f"roles.{role}.pool: pool {pool!r} is not declared in resource_pools "
                f"(declared: {', '.join(declared) or 'none'}){did_you_mean(pool, declared)}",
                key_path=f"roles.{role}.pool",
                kind="invalid",
            )
    placed = rollout_pool(cfg)
    if placed in members:
        members[placed].append(ROLLOUT_ROLE)
    elif placed is not None and strict:
        raise RecipeError(f"rollout.pool: pool {placed!r} is not declared in resource_pools "
                          f"(declared: {', '.join(members) or 'none'}){did_you_mean(placed, members)}",
                          key_path="rollout.pool", kind="invalid")
    pools = {}
    for name, spec in cfg.resource_pools.items():
        pools[name] = PoolInfo(
            name=str(name),
            roles=tuple(members[name]),
            process_on_nodes=tuple(int(n) for n in spec.process_on_nodes),
            use_gpu=bool(spec.use_gpu),
            max_colocate_count=int(spec.max_colocate_count),
            num_cpus_per_process=None if spec.num_cpus_per_process is None else float(spec.num_cpus_per_process),
        )
    if in_driver:
        pools[DRIVER_POOL] = PoolInfo(name=DRIVER_POOL, roles=tuple(in_driver), process_on_nodes=(1,), use_gpu=False,
                                      max_colocate_count=1, num_cpus_per_process=None, in_driver=True)
    return pools


def pool_key(role: str) -> str:
    """The recipe key naming ``role``'s pool: ``rollout.pool`` for the rollout group, else ``roles.<role>.pool``."""
    return "rollout.pool" if role == ROLLOUT_ROLE else f"roles.{role}.pool"


def pool_of(pools: dict[str, PoolInfo], role: str) -> PoolInfo | None:
    """The pool hosting ``role``, or None when the role is absent or its pool undeclared."""
    return next((pool for pool in pools.values() if role in pool.roles), None)


def pool_shares(pools: Iterable[PoolInfo], amount: Callable[[PoolInfo], float]) -> str:
    """Each pool's part of a total and the keys placing its roles: ``main 2 for roles.actor.pool; gen 1 for rollout.pool``."""
    return "; ".join(f"{pool.name} {amount(pool):g} for {', '.join(pool.role_keys)}" for pool in pools)
