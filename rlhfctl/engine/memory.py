"""Measure a rank's training state from its live tensors: parameters, gradients and optimizer state.

This is what ``memory/<role>/state_gib`` reports every step: the bytes of the tensors this rank holds
(a DTensor's local shard, not its global size), each storage counted once, taken right after an
optimizer step while the gradients still exist. The largest rank's value is logged, the one that
decides whether a run fits; on CUDA ``memory/<role>/max_allocated_gib`` (the allocator's peak since the
last step, largest rank) comes with it. ``rlhfctl validate`` predicts the same number before launch
(:mod:`rlhfctl.recipe.memory_plan`); a test holds the two within 5%.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["GIB", "StateBytes", "StateObserver", "state_bytes"]

GIB = float(2**30)


@dataclass(frozen=True)
class StateBytes:
    """Bytes of one rank's parameters, gradients and optimizer state."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        """Parameters + gradients + optimizer state."""
        return self.params + self.grads + self.optimizer


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The shard this rank holds (``DTensor.to_local``), or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _bytes(tensors: Iterable[torch.Tensor | None], seen: set[tuple[str, int]]) -> int:
    total = 0
    for tensor in tensors:
        if tensor is None:
            continue
        local = _local(tensor)
        storage = local.untyped_storage()
        key = (str(local.device), storage.data_ptr())
        if local.device.type == "meta" or key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def _optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> Iterable[torch.Tensor]:
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


def state_bytes(module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> StateBytes:
    """This rank's live state of ``module`` (and ``optimizer``), each storage counted once."""
    seen: set[tuple[str, int]] = set()
    parameters = list(module.parameters())
    params = _bytes(parameters, seen)
    grads = _bytes((parameter.grad for parameter in parameters), seen)
    return StateBytes(params, grads, _bytes(_optimizer_tensors(optimizer), seen))


def _largest(values: list[float], device: torch.device) -> list[float]:
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


@dataclass
class StateObserver:
    """Called after each optimizer step; keeps the largest state seen, then reports it per role."""

    module: nn.Module
    optimizer: torch.optim.Optimizer | None
    peak: StateBytes | None = field(default=None)

    def __call__(self) -> None:
        """Measure now (the optimize loop calls this while gradients exist)."""
        current = state_bytes(self.module, self.optimizer)
        if self.peak is None or current.total > self.peak.total:
            self.peak = current

    def metrics(self, role: str, device: torch.device) -> dict[str, float]:
        """``memory/<role>/state_gib`` (and ``max_allocated_gib`` on CUDA), the largest over the ranks;
        a collective, so every rank calls it. Resets the CUDA peak for the next step."""
        if self.peak is None:
            self()
        names, values = [f"memory/{role}/state_gib"], [self.peak.total / GIB]
        if device.type == "cuda":
            names.append(f"memory/{role}/max_allocated_gib")
            values.append(torch.cuda.max_memory_allocated(device) / GIB)
            torch.cuda.reset_peak_memory_stats(device)
        return dict(zip(names, _largest(values, device)))
