"""The Hugging Face export, streamed: one full tensor gathered at a time, written by rank 0 into safetensors
files of at most :data:`MAX_SHARD_BYTES`, with ``model.safetensors.index.json`` when there are several.

What lands in the files is what ``save_pretrained`` writes for the same weights: tied aliases dropped (the
first name kept, e.g. ``model.embed_tokens.weight`` over ``lm_head.weight``), a LoRA adapter merged into its
base (``W + scale * B @ A``, in float32, after the cast to the export dtype), peft's names removed, files
split greedily in state-dict order as ``huggingface_hub`` splits them (a tensor above the bound alone in its
file). A :class:`~rlhfctl.models.loading.CausalLMWithValueHead` writes its backbone so, and its head to
``value_head.safetensors``. Every rank iterates the same plan (each gather is a collective); only rank 0
keeps the gathered tensors, one file's worth at most, and frees them once the file is written.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import nn

from rlhfctl.models.loading import VALUE_HEAD_FILE
from rlhfctl.engine.placement import full_tensor
from rlhfctl.engine.lora import is_lora

__all__ = [
    "MAX_SHARD_BYTES",
    "ExportEntry",
    "export_plan",
    "lora_merged",
    "renames_on_save",
    "split_files",
    "write_hf_config",
    "write_hf_weights",
]

MAX_SHARD_BYTES = 2 * 1024**3  # per safetensors file of the export
_INDEX_FILE = "model.safetensors.index.json"
_METADATA = {"format": "pt"}  # transformers refuses safetensors files without it


@dataclass(frozen=True)
class ExportEntry:
    """One exported tensor: its name in the files, its state-dict name, its LoRA ``(A, B)`` names, its bytes."""

    name: str
    source: str
    lora: tuple[str, str] | None
    nbytes: int


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _unwrapped(module: nn.Module) -> nn.Module:
    return module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module


def _aliases(module: nn.Module) -> set[str]:
    """State-dict names that repeat an earlier name's tensor (tied weights): the same object on every rank."""
    seen: set[int] = set()
    aliases = set()
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        if id(tensor) in seen:
            aliases.add(name)
        seen.add(id(tensor))
    return aliases


def _export_bytes(tensor: torch.Tensor, dtype: torch.dtype | None) -> int:
    target = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
    return tensor.numel() * target.itemsize


def export_plan(module: nn.Module, dtype: torch.dtype | None = None) -> tuple[list[ExportEntry], list[ExportEntry]]:
    """``(weights, value_head)``: the export's tensors in file order, from shapes alone (nothing gathered)."""
    inner = _unwrapped(module)
    state = inner.state_dict()
    aliases = _aliases(inner)
    lora = is_lora(inner)
    adapter = inner.active_adapter if lora else None
    ignored = set(getattr(_owner(inner), "_keys_to_ignore_on_save", None) or ())
    weights, head = [], []
    for source, tensor in state.items():
        if source in aliases or ".lora_" in source:
            continue
        name = source.removeprefix("base_model.model.").replace(".base_layer.", ".") if lora else source
        pair = None
        if lora and source.endswith(".base_layer.weight"):
            prefix = source.removesuffix(".base_layer.weight")
            pair = (f"{prefix}.lora_A.{adapter}.weight", f"{prefix}.lora_B.{adapter}.weight")
        if name.startswith("value_head."):
            head.append(ExportEntry(name.removeprefix("value_head."), source, None, _export_bytes(tensor, dtype)))
        elif name.removeprefix("backbone.") not in ignored:
            weights.append(ExportEntry(name.removeprefix("backbone."), source, pair, _export_bytes(tensor, dtype)))
    return weights, head


def split_files(entries: list[ExportEntry], max_bytes: int) -> list[list[ExportEntry]]:
    """Greedy split in order: a new file when the next tensor would pass ``max_bytes``; a bigger one alone."""
    files: list[list[ExportEntry]] = []
    current: list[ExportEntry] = []
    size = 0
    for entry in entries:
        if entry.nbytes > max_bytes:
            files.append([entry])
            continue
        if current and size + entry.nbytes > max_bytes:
            files.append(current)
            current, size = [], 0
        current.append(entry)
        size += entry.nbytes
    if current:
        files.append(current)
    return files


def lora_merged(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, config: Any) -> torch.Tensor:
    """``W + scale * B @ A`` in float32, back in ``base``'s dtype (peft's merge, rsLoRA and fan_in_fan_out included)."""
    scale = float(config.lora_alpha) / (float(config.r) ** 0.5 if getattr(config, "use_rslora", False) else float(config.r))
    delta = b.float() @ a.float()
    if getattr(config, "fan_in_fan_out", False):
        delta = delta.T
    return (base.float() + scale * delta).to(base.dtype)


def _gathered(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    value = full_tensor(tensor).detach()
    return value.to(dtype) if dtype is not None and value.is_floating_point() else value


def _stream(module: nn.Module, files: list[list[ExportEntry]], dtype: torch.dtype | None) -> Iterator[dict[str, torch.Tensor]]:
    """Each file's tensors on rank 0 (other ranks: empty dicts), gathered one tensor at a time; collective."""
    inner = _unwrapped(module)
    state = inner.state_dict()
    config = inner.peft_config[inner.active_adapter] if is_lora(inner) else None
    keep = _rank() == 0
    for entries in files:
        bucket: dict[str, torch.Tensor] = {}
        for entry in entries:
            value = _gathered(state[entry.source], dtype)
            if entry.lora is not None:
                a, b = (_gathered(state[name], dtype) for name in entry.lora)
                value = lora_merged(value, a, b, config)
            if keep:
                bucket[entry.name] = value.cpu().contiguous()
            del value
        yield bucket


def _owner(inner: nn.Module) -> nn.Module:
    """The transformers model whose config the export carries (peft's base model, a value model's backbone)."""
    owner = inner.get_base_model() if is_lora(inner) else inner
    return getattr(owner, "backbone", owner)


def _file_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{index:05d}-of-{count:05d}.safetensors" for index in range(1, count + 1)]


def write_hf_weights(module: nn.Module, target: Path, dtype: torch.dtype | None = None,
                     max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Every rank calls this: stream ``module``'s weights into ``target`` (rank 0 writes); returns the file names."""
    weights, head = export_plan(module, dtype)
    files = split_files(weights, max_shard_bytes)
    names = _file_names(len(files))
    for name, bucket in zip(names, _stream(module, files, dtype)):
        if bucket:
            save_file(bucket, str(target / name), metadata=_METADATA)
    head_state = next(_stream(module, [head], dtype)) if head else {}
    if _rank() == 0:
        if head_state:
            save_file(head_state, str(target / VALUE_HEAD_FILE))
        if len(files) > 1:
            index = {
                "metadata": {"total_size": sum(entry.nbytes for entry in weights)},
                "weight_map": {entry.name: name for name, entries in zip(names, files) for entry in entries},
            }
            (target / _INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return names


def write_hf_config(module: nn.Module, target: Path, dtype: torch.dtype | None = None) -> None:
    """Rank 0: ``config.json`` (architecture, the export's dtype) and the generation config, as ``save_pretrained``."""
    owner = _owner(_unwrapped(module))
    config = copy.deepcopy(owner.config)
    config.architectures = [type(owner).__name__]
    written = dtype if dtype is not None else next(owner.parameters()).dtype
    config.dtype = str(written).removeprefix("torch.")
    config.save_pretrained(str(target))
    if owner.can_generate() and getattr(owner, "generation_config", None) is not None:
        owner.generation_config.save_pretrained(str(target))


def renames_on_save(module: nn.Module) -> bool:
    """Whether transformers would rename or fuse tensors on save (its weight conversions, e.g. MoE experts in
    transformers 5): such a model is exported whole by ``save_pretrained`` instead (shapes checked on meta)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion  # transformers 5 only: tried here
    except ImportError:  # transformers 4 has no weight conversions
        return False
    owner = _owner(_unwrapped(module))
    weights, _ = export_plan(module)
    shapes = {entry.name: torch.empty(_unwrapped(module).state_dict()[entry.source].shape, device="meta") for entry in weights}
    return set(revert_weight_conversion(owner, dict(shapes))) != set(shapes)
