"""The memory plan's per-role records: which model a role plans (:class:`PlannedModel`) and the state each of its
ranks holds (:class:`RoleMemory`, :class:`RankMemory`).

Both :mod:`rlhfctl.recipe.memory_calls` (the terms of each call) and :mod:`rlhfctl.recipe.memory_plan` (which
builds them) read these, so they live here and the two modules import them one way.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfctl.recipe.schema import ModelConfig

__all__ = ["PlannedModel", "RankMemory", "RoleMemory"]


@dataclass(frozen=True)
class PlannedModel:
    """A role the plan counts: the model it builds (``kind``: causal, value or classifier) and whether it trains."""

    role: str
    kind: str  # causal | value | classifier
    trainable: bool
    model: ModelConfig


@dataclass(frozen=True)
class RankMemory:
    """Bytes of state one rank of one role holds."""

    rank: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    kv_cache_bytes: int
    offloaded: bool

    @property
    def state_bytes(self) -> int:
        """Parameters + gradients + optimizer state (what ``memory/<role>/state_gib`` measures)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def device_bytes(self) -> int:
        """The state unless offloaded, plus the hf engine's KV cache (the per-call view is a call's ``Phase``)."""
        return (0 if self.offloaded else self.state_bytes) + self.kv_cache_bytes


@dataclass(frozen=True)
class RoleMemory:
    """One role's plan: what it is, and what state each of its ranks holds."""

    role: str
    pool: str
    world_size: int
    strategy: str
    trainable: bool
    param_dtype: str
    parameters: int
    trainable_parameters: int
    ranks: tuple[RankMemory, ...]
    note: str = ""
    param_offload: bool = False  # fsdp.param_offload: the weights wait in host memory outside the role's own calls
    optimizer_offload: bool = False  # fsdp.optimizer_offload: AdamW's moments wait in host memory outside its update

    @property
    def largest(self) -> RankMemory:
        """The rank holding the most (rank 0 when shards are uneven)."""
        return max(self.ranks, key=lambda rank: (rank.device_bytes, rank.state_bytes))
