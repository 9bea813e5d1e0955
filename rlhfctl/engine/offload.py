"""Offload between phases: a role's FSDP2 shards wait in host memory while other roles' calls run.

``roles.<role>.fsdp.param_offload`` and ``optimizer_offload`` (verl's meaning), read through
``rlhfctl.engine.placement.engine_settings``:

- ``param_offload``: the role's parameter shards (and buffers) move to host memory after each of its calls
  and come back to its device at the start of the next one. A frozen reference offloads this way too.
- ``optimizer_offload``: AdamW's moments move to host memory after each call and come back for the next;
  AdamW still steps on the device.

The moves are explicit, around each registered method of the role (:func:`on_device`), so the role's own
calls see everything on its device, as without offload. Each move copies into fresh storage (pinned host
memory on a CUDA role, so the copies back can overlap), and leaves the values bit for bit as they were.
On a CPU role the "device" is the host: the code path still runs (fresh copies), and costs one copy.

Today's ``fsdp.cpu_offload`` (``CPUOffloadPolicy``: the shards live on the host for the whole run, AdamW
steps there) is a separate, slower choice; with it these moves are skipped, the shards being on the host.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from rlhfctl.engine.placement import EngineSettings

__all__ = ["HOST", "move_optimizer_state", "move_parameters", "offloads", "on_device", "resident", "to_host"]

HOST = torch.device("cpu")
_DEPTH = "_rlhfctl_resident_depth"  # nested resident blocks (a call inside a call) move once
Method = TypeVar("Method", bound=Callable[..., Any])


def _copy_to(tensor: torch.Tensor, device: torch.device, pin: bool) -> torch.Tensor:
    """A copy of ``tensor`` on ``device`` in fresh storage (a DTensor keeps its mesh and placements)."""
    if isinstance(tensor, DTensor):
        local = _copy_to(tensor.to_local(), device, pin)
        return DTensor.from_local(local, tensor.device_mesh, tensor.placements, run_check=False,
                                  shape=tensor.shape, stride=tensor.stride())
    if pin and device.type == "cpu":
        return torch.empty_like(tensor, device=device, pin_memory=True).copy_(tensor)
    return tensor.to(device, copy=True)


def move_parameters(module: nn.Module, device: torch.device, *, pin: bool = False) -> None:
    """Copy ``module``'s parameter shards, gradients and buffers to ``device``; the Parameter objects stay
    (FSDP2 re-registers its shards, the optimizer keeps its keys)."""
    module._apply(lambda tensor: _copy_to(tensor, device, pin))


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device, *, pin: bool = False) -> None:
    """Copy the optimizer's per-parameter tensors (AdamW's moments) to ``device``; the scalar ``step``
    counters stay where AdamW keeps them."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = _copy_to(value, device, pin)


def offloads(settings: EngineSettings | None) -> tuple[bool, bool]:
    """Whether the role offloads ``(parameters, optimizer state)`` between its calls (FSDP2 only; under
    ``cpu_offload`` the shards already live on the host)."""
    if settings is None or settings.strategy != "fsdp2" or settings.cpu_offload:
        return False, False
    return settings.param_offload, settings.optimizer_offload


def to_host(module: nn.Module, optimizer: torch.optim.Optimizer | None, settings: EngineSettings | None,
            device: torch.device) -> None:
    """Move what the role offloads to host memory (pinned for a CUDA role): after a call, or once built."""
    params, optim = offloads(settings)
    _place(module, optimizer, HOST, params, optim, pin=device.type == "cuda")


@contextlib.contextmanager
def resident(
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    settings: EngineSettings | None,
    device: torch.device,
) -> Iterator[None]:
    """Within the block the role's offloaded state is on ``device``; after it, back in host memory. Nested
    blocks (a call inside a call) move once, at the outermost."""
    depth = getattr(module, _DEPTH, 0)
    params, optim = offloads(settings) if depth == 0 else (False, False)
    _place(module, optimizer, device, params, optim, pin=False)
    setattr(module, _DEPTH, depth + 1)
    try:
        yield
    finally:
        setattr(module, _DEPTH, depth)
        if depth == 0:
            to_host(module, optimizer, settings, device)


def _place(module: nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device,
           params: bool, optim: bool, *, pin: bool) -> None:
    if params:
        move_parameters(module, device, pin=pin)
    if optim and optimizer is not None:
        move_optimizer_state(optimizer, device, pin=pin)


def on_device(method: Method) -> Method:
    """Decorate a role worker's method (under ``@register``): with offload, the worker's model (``module``,
    else ``model``) and ``optimizer`` are on its device for the call and in host memory after it; a model
    that the call builds (``init_model``) goes to host memory at its end."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        module, optimizer = _state(self)
        if module is None:
            result = method(self, *args, **kwargs)
            module, optimizer = _state(self)
            if module is not None:
                to_host(module, optimizer, self.engine, self.device)
            return result
        with resident(module, optimizer, self.engine, self.device):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _state(worker: Any) -> tuple[nn.Module | None, torch.optim.Optimizer | None]:
    module = getattr(worker, "module", None)
    return (module if module is not None else getattr(worker, "model", None)), getattr(worker, "optimizer", None)
