"""The training engine of a model role: how its weights are placed across ranks and in which precision.

Two strategies (``roles.<role>.strategy``):

- ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on every decoder layer and on the root, so each rank
  keeps 1/world of the parameters, gradients and optimizer state. Trainable roles keep float32 shards
  (the master weights) and compute in ``model.dtype`` through ``MixedPrecisionPolicy(param_dtype=...,
  reduce_dtype=float32)``.
- ``ddp``: a full replica per rank (``DistributedDataParallel`` for trainable roles at world > 1). Trainable
  roles keep float32 weights and run their forward under ``torch.autocast`` in ``model.dtype``; DDP
  reduces the float32 gradients.

Frozen roles (reference, reward model) store their weights in ``model.dtype`` under both strategies.

Sampling runs inside :func:`serving`: under FSDP2 the weights are gathered once (compute dtype) for the
whole call, so ranks may run different numbers of forward passes (sampling stops at EOS per rank) without
a collective per step. The no-gradient scoring passes (reference and old log-probs, values, a reward
model's scores) run inside :func:`scoring`: FSDP2 gathers one unit at a time for its forward and frees it
after, so no rank ever holds the whole model; each forward is then a collective, and the scoring loops
run as many micro-batches on every rank (``rlhfctl.engine.micro_batches.scoring_slices``). Issue-18-style weight
sync reads the full weights through :func:`full_state_items`, whatever the strategy.

The FSDP2 mesh is built on the role's device type (:func:`mesh_device_type`), so a CPU role on a GPU host
shards over gloo on the CPU. ``fsdp.param_offload`` / ``fsdp.optimizer_offload`` keep a role's shards in
host memory between its calls (``rlhfctl.engine.offload``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoConfig

from rlhfctl.models.loading import cast_parameters, resolve_dtype, trained_leaves
from rlhfctl.recipe.resolve import STRATEGIES, resolve_strategy  # the one home of the strategy default
from rlhfctl.single_controller import register_dispatch_mode
from rlhfctl.single_controller.worker import free_port
from rlhfctl.recipe.resolved import resolve_mapping
from rlhfctl.recipe.schema import FsdpConfig
from rlhfctl.recipe.specs import Recipe
from rlhfctl.engine.sharded_load import NotShardable, ShardedLoad, checkpoint_directory, parameters_on_meta

__all__ = [
    "ONE_TO_ALL_FIRST",
    "STRATEGIES",
    "EngineSettings",
    "clip_grad_norm",
    "collective_device",
    "engine_settings",
    "forwards_are_collective",
    "full_state_dict",
    "full_tensor",
    "full_state_items",
    "is_sharded",
    "local_state_bytes",
    "materialize",
    "mesh_device_type",
    "resolve_strategy",
    "scoring",
    "scoring_grad_mode",
    "serving",
    "shard_model",
]

def _same_args(group: Any, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    return tuple([arg] * group.world_size for arg in args), {key: [value] * group.world_size for key, value in kwargs.items()}


def _rank_zero_result(info: Any, outputs: list) -> Any:
    return outputs[0]


ONE_TO_ALL_FIRST = register_dispatch_mode("ONE_TO_ALL_FIRST", _same_args, _rank_zero_result)
"""Every rank runs the call (a collective such as gathering sharded weights); the caller gets rank 0's result."""


@dataclass(frozen=True)
class EngineSettings:
    """How one role's model is placed: strategy, compute dtype, whether it trains, and FSDP2 options."""

    strategy: str
    compute_dtype: torch.dtype
    trainable: bool
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    param_offload: bool = False
    optimizer_offload: bool = False

    @property
    def storage_dtype(self) -> torch.dtype:
        """float32 master weights for a trainable role; the compute dtype for a frozen one."""
        return torch.float32 if self.trainable else self.compute_dtype

    @property
    def autocast(self) -> bool:
        """Whether the replicated path needs autocast to compute below the float32 storage."""
        return self.strategy == "ddp" and self.storage_dtype != self.compute_dtype


def compute_dtype(model_dtype: Any) -> torch.dtype:
    """The torch dtype a recipe's dtype name computes in (``model.dtype``, ``rollout.dtype``): ``auto`` is float32."""
    dtype = resolve_dtype(model_dtype)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def engine_settings(
    recipe: Recipe | Mapping[str, Any], role: str, model_dtype: Any, world_size: int, *, trainable: bool
) -> EngineSettings:
    """``roles.<role>.strategy`` (null: by the ranks the role really has) and ``roles.<role>.fsdp``, from the resolved
    recipe (plain recipe data is resolved first); a role without a section (the rollout group) takes the defaults."""
    resolved = recipe if isinstance(recipe, Recipe) else resolve_mapping(recipe)
    spec = resolved.roles.get(role)
    fsdp = spec.settings.fsdp if spec is not None else FsdpConfig()
    compute = compute_dtype(model_dtype)
    return EngineSettings(
        strategy=resolve_strategy(spec.settings.get("strategy") if spec is not None else None, world_size),
        compute_dtype=compute,
        trainable=trainable,
        reshard_after_forward=bool(fsdp.reshard_after_forward),
        cpu_offload=bool(fsdp.cpu_offload),
        param_offload=bool(fsdp.param_offload),
        optimizer_offload=bool(fsdp.optimizer_offload),
    )


# --------------------------------------------------------------------------- process group


def _ensure_group(device: torch.device) -> None:
    """FSDP2 needs a process group even at world size 1 (the local backend, one GPU)."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=600))


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


# --------------------------------------------------------------------------- building and wrapping


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks (the classes transformers lists in ``_no_split_modules``)."""
    names: set[str] = set()
    for sub in module.modules():
        names.update(getattr(sub, "_no_split_modules", None) or ())
    return [sub for sub in module.modules() if type(sub).__name__ in names]


def is_sharded(module: nn.Module) -> bool:
    """True for a module that ``fully_shard`` has wrapped."""
    return isinstance(module, FSDPModule)


def mesh_device_type(device: torch.device, cuda_available: bool) -> str:
    """The device type of a role's FSDP2 mesh: the role's own. ``fully_shard`` without a mesh takes the
    host's accelerator, which is CUDA on a GPU host even for a ``use_gpu: false`` role on gloo."""
    if device.type == "cuda" and not cuda_available:
        raise RuntimeError("an FSDP2 role on a CUDA device needs CUDA, which this process does not see")
    return device.type


def _fully_shard(module: nn.Module, settings: EngineSettings, device: torch.device) -> None:
    _ensure_group(device)
    mixed = settings.compute_dtype != settings.storage_dtype
    mesh = init_device_mesh(mesh_device_type(device, torch.cuda.is_available()), (_world(),))
    options: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=settings.compute_dtype if mixed else None, reduce_dtype=torch.float32),
        "reshard_after_forward": settings.reshard_after_forward,
    }
    if settings.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    for layer in decoder_layers(module):
        fully_shard(layer, **options)
    fully_shard(module, **options)


class _Autocast:
    """Forward hooks that run a module's forward under ``torch.autocast`` (kept on deep copies too)."""

    def __init__(self, device_type: str, dtype: torch.dtype) -> None:
        self.device_type, self.dtype, self.stack = device_type, dtype, []

    def enter(self, module: nn.Module, args: Any) -> None:
        context = torch.autocast(self.device_type, dtype=self.dtype)
        context.__enter__()
        self.stack.append(context)

    def leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.stack:
            self.stack.pop().__exit__(None, None, None)


def shard_model(module: nn.Module, settings: EngineSettings, device: torch.device) -> nn.Module:
    """Place ``module`` by ``settings``; returns what training runs through (FSDP2: the module itself)."""
    if settings.strategy == "fsdp2":
        _fully_shard(module, settings, device)
        if settings.cpu_offload:
            _buffers_to(module, device)  # the parameters stay on the host, managed by the offload policy
        else:
            module.to(device)
        return module
    module.to(device)
    if settings.autocast:
        hooks = _Autocast(device.type, settings.compute_dtype)
        module.register_forward_pre_hook(hooks.enter)
        module.register_forward_hook(hooks.leave, always_call=True)
    if settings.trainable and dist.is_initialized() and dist.get_world_size() > 1:
        device_ids = [device.index if device.index is not None else 0] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(module, device_ids=device_ids)
    return module


def _meta_model_cfg(model_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The same architecture as an inline config: ``from_pretrained`` cannot build on the meta device."""
    if model_cfg.get("path") in (None, ""):
        return dict(model_cfg)
    path = os.path.expanduser(str(model_cfg["path"]))
    config = AutoConfig.from_pretrained(path, trust_remote_code=bool(model_cfg.get("trust_remote_code")))
    fields = {k: v for k, v in config.to_dict().items() if k not in ("architectures", "transformers_version", "dtype", "torch_dtype")}
    return {**model_cfg, "path": None, "config": fields}


def materialize(
    build: Callable[[Mapping[str, Any]], nn.Module],
    model_cfg: Mapping[str, Any],
    settings: EngineSettings,
    device: torch.device,
) -> tuple[nn.Module, nn.Module]:
    """Build, cast and place a role's model; returns ``(module, model)`` (see :func:`shard_model`).

    ``build(model_cfg)`` loads the weights (and applies LoRA, activation checkpointing). Only parameters
    are cast: trainable ones to the storage dtype, frozen ones (a LoRA base) to the compute dtype; floating
    buffers (rotary ``inv_freq``) stay float32, as ``from_pretrained`` keeps them. Under FSDP2 at world > 1,
    a ``model.path`` with safetensors files loads sharded (``rlhfctl/engine/sharded_load.py``): every rank builds
    on meta and reads only its own rows. An inline ``model.config`` (or a checkpoint that cannot be read so)
    is built by rank 0 alone and broadcast shard by shard; the other ranks build on the meta device.
    """
    frozen = settings.compute_dtype  # only trainable parameters keep float32 masters
    if settings.strategy != "fsdp2" or _world() == 1:
        module = cast_parameters(build(model_cfg), settings.storage_dtype, frozen)
        for leaf in trained_leaves(module, frozen) if settings.strategy == "fsdp2" else ():
            _fully_shard(leaf, settings, device)  # one dtype per FSDP2 unit (see trained_leaves)
        return module, shard_model(module, settings, device)
    directory = checkpoint_directory(model_cfg)
    if directory is not None:
        seed = [torch.initial_seed()]  # rank 0's: fresh tensors (a LoRA adapter, a new head) alike on every rank
        dist.broadcast_object_list(seed, src=0)
        with parameters_on_meta():
            full = cast_parameters(build(_meta_model_cfg(model_cfg)), settings.storage_dtype, frozen)
        try:
            loading = ShardedLoad.prepare(full, directory, decoder_layers(full), int(seed[0]))
        except NotShardable as why:
            warnings.warn(f"model.path {model_cfg['path']!r}: {why}; rank 0 loads it whole and broadcasts", stacklevel=2)
        else:
            for leaf in trained_leaves(full, frozen):
                _fully_shard(leaf, settings, device)
            _fully_shard(full, settings, device)
            full.to_empty(device=torch.device("cpu") if settings.cpu_offload else device)
            full.load_report = loading.fill(full, _rank(), _world())
            if settings.cpu_offload:
                _offload_parameters(full, device)
            return full, full
    if _rank() == 0:
        full = cast_parameters(build(model_cfg), settings.storage_dtype, frozen)
        state = full.state_dict()
        buffers = {name: buffer for name, buffer in full.named_buffers()}
    else:
        with torch.device("meta"):
            full = cast_parameters(build(_meta_model_cfg(model_cfg)), settings.storage_dtype, frozen)
        state, buffers = {}, {}
    names = [name for name, _ in full.named_buffers()]
    for leaf in trained_leaves(full, frozen):
        _fully_shard(leaf, settings, device)
    _fully_shard(full, settings, device)
    # The broadcasts run where the group's backend can reach: NCCL only moves device tensors, so the
    # shards load on the device even with cpu_offload, and move to the host once loaded.
    full.to_empty(device=collective_device(device) if settings.cpu_offload else device)
    set_model_state_dict(full, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for name, buffer in full.named_buffers():  # non-persistent buffers (rotary inv_freq) are not in the state
        if name in names:
            if _rank() == 0:
                buffer.copy_(buffers[name].to(buffer.device))
            dist.broadcast(buffer, src=0)
    if settings.cpu_offload:
        _offload_parameters(full, device)
    return full, full


def collective_device(device: torch.device) -> torch.device:
    """Where tensors must live for the group's collectives: the role's device under NCCL, the CPU under gloo."""
    return device if _nccl_group() else torch.device("cpu")


def _nccl_group() -> bool:
    """Whether the default group runs NCCL, which moves device tensors only (a CPU tensor fails there)."""
    return dist.is_initialized() and "nccl" in str(dist.get_backend())


def _offload_parameters(module: nn.Module, device: torch.device) -> None:
    """FSDP2 offload: the sharded parameters on the host (the offload policy moves them in for compute),
    the buffers on the compute device, where the forward reads them."""
    module.to("cpu")
    _buffers_to(module, device)


def _buffers_to(module: nn.Module, device: torch.device) -> None:
    with torch.no_grad():
        for buffer in module.buffers():
            buffer.data = buffer.data.to(device)


# --------------------------------------------------------------------------- running


_GATHERED = "_rlhfctl_gathered"  # set on the FSDP2 units while serving() holds them whole


def _autocast(module: nn.Module, settings: EngineSettings) -> contextlib.AbstractContextManager:
    if settings.autocast:
        return torch.autocast(module_device(module).type, dtype=settings.compute_dtype)
    return contextlib.nullcontext()


@contextlib.contextmanager
def serving(module: nn.Module, settings: EngineSettings) -> Iterator[nn.Module]:
    """Sampling without gradients: FSDP2 gathers the weights once for the whole block (no collective per
    forward, so ranks may run different numbers of steps); DDP autocasts as in training."""
    if settings.strategy != "fsdp2":
        with _autocast(module, settings):
            yield module
        return
    wrapped = [sub for sub in module.modules() if is_sharded(sub)]
    for sub in wrapped:
        sub.unshard()
    for sub in wrapped:
        sub.set_reshard_after_forward(False, recurse=False)
        setattr(sub, _GATHERED, True)
    try:
        yield module
    finally:
        for sub in wrapped:
            setattr(sub, _GATHERED, False)
            sub.set_reshard_after_forward(settings.reshard_after_forward, recurse=False)
            sub.reshard()


@contextlib.contextmanager
def scoring(module: nn.Module, settings: EngineSettings) -> Iterator[nn.Module]:
    """The no-gradient scoring passes: FSDP2 gathers each unit for its own forward and frees it after, so
    a rank holds one unit whole at a time, not the model. Every forward is then a collective: run as many
    on every rank (``rlhfctl.engine.micro_batches.scoring_slices``). Inside :func:`serving` the units are whole
    already, and stay so. DDP autocasts as in training."""
    if settings.strategy != "fsdp2":
        with _autocast(module, settings):
            yield module
        return
    wrapped = [sub for sub in module.modules() if is_sharded(sub)]
    if any(getattr(sub, _GATHERED, False) for sub in wrapped):
        yield module
        return
    for sub in wrapped:
        sub.set_reshard_after_forward(True, recurse=False)
    try:
        yield module
    finally:
        for sub in wrapped:
            sub.set_reshard_after_forward(settings.reshard_after_forward, recurse=False)
            sub.reshard()


def forwards_are_collective(module: nn.Module) -> bool:
    """Whether a forward of ``module`` gathers FSDP2 units from other ranks, so every rank must run it as
    often: FSDP2 at world > 1, outside :func:`serving`'s whole-model gather."""
    units = [sub for sub in module.modules() if is_sharded(sub)]
    return bool(units) and _world() > 1 and not all(getattr(sub, _GATHERED, False) for sub in units)


def scoring_grad_mode(module: nn.Module) -> contextlib.AbstractContextManager:
    """``no_grad`` where a forward gathers FSDP2 units (gathered into FSDP's own buffers, which must not
    become inference tensors that training then cannot write), else the cheaper ``inference_mode``."""
    per_unit = any(is_sharded(sub) and not getattr(sub, _GATHERED, False) for sub in module.modules())
    return torch.no_grad() if per_unit else torch.inference_mode()


def module_device(module: nn.Module) -> torch.device:
    """The device of the module's first parameter (local shard under FSDP2)."""
    parameter = next(module.parameters())
    return parameter.to_local().device if isinstance(parameter, DTensor) else parameter.device


def full_tensor(tensor: Any) -> torch.Tensor:
    """The whole of a DTensor (a plain tensor as it is); CPU-offloaded shards hop to CUDA for NCCL."""
    if not isinstance(tensor, DTensor):
        return tensor
    local = tensor.to_local()
    if local.device.type == "cpu" and _nccl_group():
        moved = DTensor.from_local(local.cuda(), tensor.device_mesh, tensor.placements, shape=tensor.shape, stride=tensor.stride())
        return moved.full_tensor().to(local.device)
    return tensor.full_tensor()


def clip_grad_norm(parameters: list[nn.Parameter], max_norm: float) -> float:
    """Clip to the global gradient norm, over every shard of every rank; returns that norm."""
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if not grads:
        return 0.0
    total = full_tensor(torch.nn.utils.get_total_norm(grads, 2.0))
    if max_norm != float("inf"):
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return float(total)


# --------------------------------------------------------------------------- full weights and sizes


def full_state_items(module: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` of the state dict, gathered shard by shard (FSDP2), for DDP or plain modules.

    Collective under FSDP2: every rank must iterate to the end. Tensors are on the module's device;
    floating ones are cast to ``dtype`` when given.
    """
    inner = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
    for name, tensor in inner.state_dict().items():
        value = full_tensor(tensor)
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        yield name, value.detach()


def full_state_dict(module: nn.Module, dtype: torch.dtype | None = None, rank0_only: bool = True) -> dict[str, torch.Tensor]:
    """The full state on the CPU (rank 0 only by default: other ranks take part and get ``{}``)."""
    keep = not rank0_only or _rank() == 0
    state = {}
    for name, tensor in full_state_items(module, dtype):
        if keep:
            state[name] = tensor.cpu().contiguous()
    return state


def _local_bytes(tensor: torch.Tensor | None) -> int:
    if tensor is None or not isinstance(tensor, torch.Tensor):
        return 0
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def local_state_bytes(module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer state (local shards under FSDP2).

    Gradients count as the trainable parameters' local size: that is what they take during backward
    (they are freed after each optimizer step, so reading ``.grad`` afterwards would say 0).
    """
    parameters = list(module.parameters())
    optim = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            optim += sum(_local_bytes(value) for value in state.values() if isinstance(value, torch.Tensor) and value.dim() > 0)
    return {
        "params": sum(_local_bytes(p) for p in parameters),
        "grads": sum(_local_bytes(p) for p in parameters if p.requires_grad),
        "optimizer": optim,
    }
