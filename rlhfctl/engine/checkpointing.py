"""Save and load one trainable role's state: sharded model and optimizer state, scheduler, RNG states,
the worker's counters, and the model as a Hugging Face directory.

Layout of ``<directory>/<role>/``::

    state/                     model + optimizer through torch.distributed.checkpoint (each rank writes
                               its shards; loads at any world size and under either strategy)
    hf/                        the model as a Hugging Face directory (config, safetensors, tokenizer,
                               generation config; LoRA merged), loadable without rlhfctl; in the
                               caller's dtype (the workers pass the role's compute dtype by default)
    adapter/                   with LoRA: adapter_config.json + adapter_model.safetensors
    scheduler.pt               scheduler.state_dict()
    worker_state.pt            {"rng": rank 0's RNG, "rank_rng": [every rank's RNG], "counters": {...}}
    checkpoint.json            what wrote it (role, worker class, lora or not, strategy, world size)

With LoRA the state holds the adapter and its optimizer only (the base weights stay those of
``model.path``). Every ``.pt`` file loads with ``torch.load(..., weights_only=True)``. A role directory
is written to a staging sibling and renamed by rank 0 once every rank has written, so an interrupted
save never leaves a half-written checkpoint. Format 1 (``model.safetensors`` written by rank 0) still
loads into an unsharded model.

:func:`start_role_save` with ``asynchronous=True`` writes ``state/`` with
``torch.distributed.checkpoint.async_save``: the state is copied to CPU memory before it returns, then
a background thread writes it (its collectives on a gloo group of their own, :func:`checkpoint_group`,
so they never interleave with training's), while the caller trains on. :meth:`PendingRoleSave.complete`
waits for that write and only then renames the staging directory into place.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from safetensors.torch import load_model, save_file
from torch import nn

from rlhfctl.engine.placement import full_state_dict, full_tensor
from rlhfctl.engine.hf_export import (MAX_SHARD_BYTES, export_plan, lora_merged, renames_on_save, write_hf_config,
                               write_hf_weights)
from rlhfctl.engine.lora import is_lora, load_adapter
from rlhfctl.engine.seeding import capture_rng_state, restore_rng_state, rng_state_for_rank
from rlhfctl.models.loading import save_hf_model

__all__ = [
    "ADAPTER_DIR",
    "HF_DIR",
    "STATE_DIR",
    "PendingRoleSave",
    "checkpoint_group",
    "load_role_state",
    "role_directory",
    "save_hf_directory",
    "start_role_save",
]

MODEL_FILE = "model.safetensors"
STATE_DIR = "state"
HF_DIR = "hf"
ADAPTER_DIR = "adapter"
SCHEDULER_FILE = "scheduler.pt"
WORKER_STATE_FILE = "worker_state.pt"
INFO_FILE = "checkpoint.json"
FORMAT = 2


def role_directory(directory: str | os.PathLike[str], role: str) -> Path:
    """``<directory>/<role>``, with ``~`` expanded."""
    return Path(os.path.expanduser(str(directory))) / role


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _options(module: nn.Module) -> Any:
    lora = is_lora(module)  # the adapter only: the frozen base is model.path's (non-strict load)
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


def _sharded_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    model_state, optim_state = get_state_dict(module, optimizer, options=_options(module))
    return {"model": model_state, "optim": optim_state}


def save_hf_directory(module: nn.Module, tokenizer: Any, target: Path, dtype: torch.dtype | None = None,
                      max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    """Write ``module`` (LoRA merged) as a Hugging Face directory; collective, rank 0 writes.

    Streamed (``rlhfctl/engine/hf_export.py``): one tensor gathered at a time, files of at most ``max_shard_bytes``
    with their index, so no rank holds the whole model. A model that transformers renames on save (its
    weight conversions) goes through ``save_pretrained`` on the state gathered on rank 0 instead.
    """
    if _rank() == 0:
        target.mkdir(parents=True, exist_ok=True)
    if renames_on_save(module):
        _save_hf_whole(module, tokenizer, target, dtype)
        return target
    write_hf_weights(module, target, dtype, max_shard_bytes)
    if _rank() == 0:
        write_hf_config(module, target, dtype)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(target))
    return target


def _save_hf_whole(module: nn.Module, tokenizer: Any, target: Path, dtype: torch.dtype | None) -> None:
    """``save_pretrained`` of the whole state gathered on rank 0 (LoRA merged): for models it renames on save."""
    state = full_state_dict(module, dtype)
    if _rank() != 0:
        return
    owner = module
    if is_lora(module):
        config = module.peft_config[module.active_adapter]
        weights, _ = export_plan(module, dtype)
        state = {entry.name: lora_merged(state[entry.source], state[entry.lora[0]], state[entry.lora[1]], config)
                 if entry.lora else state[entry.source] for entry in weights}
        owner = module.get_base_model()
    save_hf_model(owner, tokenizer, target, state_dict=state)


def _save_adapter(module: nn.Module, target: Path) -> None:
    """The LoRA adapter from the gathered state (peft's own save cannot read sharded tensors)."""
    from peft import get_peft_model_state_dict  # peft: only with LoRA

    keep = _rank() == 0  # the adapter's tensors only, gathered one at a time: never the base model
    state = {}
    for name, tensor in module.state_dict().items():
        if ".lora_" in name:
            value = full_tensor(tensor).detach()
            if keep:
                state[name] = value.cpu()
    if keep:
        target.mkdir(parents=True, exist_ok=True)
        adapter = get_peft_model_state_dict(module, state_dict=state, adapter_name=module.active_adapter)
        save_file({key: value.contiguous() for key, value in adapter.items()}, str(target / "adapter_model.safetensors"))
        module.peft_config[module.active_adapter].save_pretrained(str(target))


def checkpoint_group() -> Any:
    """A gloo group for background checkpoint writes (None without a process group); every rank calls it in turn.

    ``async_save`` runs its collectives (plan and metadata exchange) in its writer thread. On the group
    that training uses they could interleave differently on two ranks with the next step's collectives;
    on a group of their own they cannot. It is gloo because the staged state is on the CPU.
    """
    return dist.new_group(backend="gloo") if dist.is_initialized() else None


@dataclass
class PendingRoleSave:
    """A role's save whose ``state/`` may still be writing; :meth:`complete` waits and moves it into place."""

    target: Path
    staging: Path
    write: Future | None  # the background write of state/ (async_save); None when it was written before returning

    def written(self) -> bool:
        """Whether this rank's ``state/`` write has finished."""
        return self.write is None or self.write.done()

    def complete(self) -> Path:
        """Every rank calls this: wait for the write, then rank 0 renames the staging directory to ``target``."""
        if self.write is not None:
            self.write.result()  # re-raises the writer thread's error: the staging directory stays, ignored
        _barrier()
        if _rank() == 0:
            if self.target.exists():
                shutil.rmtree(self.target)
            os.replace(self.staging, self.target)
        _barrier()
        return self.target


def _write_state(state: dict[str, Any], path: Path, asynchronous: bool, process_group: Any) -> Future | None:
    """Write the sharded state to ``path``: at once, or staged to CPU memory and written by a thread (its future)."""
    no_dist = not dist.is_initialized()
    if not asynchronous:
        dcp.save(state, checkpoint_id=str(path), no_dist=no_dist)
        return None
    response = dcp.async_save(state, checkpoint_id=str(path), process_group=process_group, no_dist=no_dist)
    return getattr(response, "upload_completion", response)  # an AsyncSaveResponse when staging is itself async


def start_role_save(
    target: Path,
    *,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    counters: dict[str, int],
    info: dict[str, Any],
    write_hf: Callable[[Path], None],
    rank_rng: list[dict[str, Any]] | None = None,
    asynchronous: bool = False,
    process_group: Any = None,
) -> PendingRoleSave:
    """Every rank calls this: write the role's state next to ``target``; :meth:`PendingRoleSave.complete` finishes it.

    With ``asynchronous`` the sharded state is copied to CPU memory and written in the background
    (collectives on ``process_group``, :func:`checkpoint_group`); the Hugging Face directory and the small
    files are written before this returns. ``rank_rng`` holds every rank's RNG state in rank order
    (:func:`rlhfctl.engine.seeding.gather_rng_states`); without it, only rank 0's state is saved.
    """
    staging = target.parent / f".{target.name}.saving"
    if _rank() == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    _barrier()
    write = _write_state(_sharded_state(module, optimizer), staging / STATE_DIR, asynchronous, process_group)
    write_hf(staging / HF_DIR)
    lora = is_lora(module)
    if lora:
        _save_adapter(module, staging / ADAPTER_DIR)
    if _rank() == 0:
        torch.save(scheduler.state_dict(), staging / SCHEDULER_FILE)
        rank_rng = rank_rng or [capture_rng_state()]
        torch.save({"rng": rank_rng[0], "rank_rng": rank_rng, "counters": dict(counters)}, staging / WORKER_STATE_FILE)
        (staging / INFO_FILE).write_text(json.dumps({**info, "lora": lora, "format": FORMAT}, indent=2) + "\n")
    return PendingRoleSave(target, staging, write)


def _load(path: Path, device: torch.device | str = "cpu") -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {path} is missing")
    return torch.load(path, map_location=device, weights_only=True)


def load_role_state(
    source: Path,
    *,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    device: torch.device,
    rank: int = 0,
) -> dict[str, int]:
    """Every rank calls this: restore what :func:`start_role_save` wrote (at any world size), with ``rank``'s
    own RNG state (see :func:`rlhfctl.engine.seeding.rng_state_for_rank` for another number of ranks); returns the counters."""
    if not source.is_dir():
        raise FileNotFoundError(f"no checkpoint for this role at {source}")
    if (source / STATE_DIR).is_dir():
        state = _sharded_state(module, optimizer)
        dcp.load(state, checkpoint_id=str(source / STATE_DIR), no_dist=not dist.is_initialized())
        set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=_options(module))
    else:
        _load_format_1(source, module, optimizer, device)
    scheduler.load_state_dict(_load(source / SCHEDULER_FILE))
    state = _load(source / WORKER_STATE_FILE)
    rng = rng_state_for_rank(state, rank)
    if rng is not None:
        restore_rng_state(rng)
    return {key: int(value) for key, value in state.get("counters", {}).items()}


def _load_format_1(source: Path, module: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Checkpoints written before the sharded format: full weights (or adapter) and ``optimizer.pt``."""
    if is_lora(module):
        if not (source / ADAPTER_DIR).is_dir():
            raise FileNotFoundError(f"{source} holds no LoRA adapter ({ADAPTER_DIR}/), but the model has one")
        load_adapter(module, source / ADAPTER_DIR, device)
    else:
        if not (source / MODEL_FILE).is_file():
            raise FileNotFoundError(f"{source} holds neither {STATE_DIR}/ nor {MODEL_FILE}")
        missing, unexpected = load_model(module, str(source / MODEL_FILE), strict=False, device=str(device))
        if missing or unexpected:
            raise RuntimeError(
                f"{source / MODEL_FILE} does not match the model: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
    optimizer.load_state_dict(_load(source / "optimizer.pt"))
