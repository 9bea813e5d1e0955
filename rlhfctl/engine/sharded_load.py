"""Sharded load: each FSDP2 rank reads from a checkpoint's safetensors files only the rows of its own shards.

The model is built with its parameters on the meta device (:func:`parameters_on_meta`: buffers such as the
rotary ``inv_freq`` are computed for real, as at init), cast, wrapped by ``fully_shard``, given empty local
shards, then :func:`load_local_shards` fills each shard from ``safe_open(...).get_slice(name)[start:stop]``.
FSDP2 shards dim 0 in ``torch.chunk`` pieces: rank ``r`` holds rows ``[r * ceil(rows / world), ...)``, the
last ranks fewer or none. No process holds a whole model, and no full tensor is broadcast.

Parameters the files do not hold ("fresh": a LoRA adapter, a value or score head new on a checkpoint) are
initialised on every rank alike from the run's seed, as a full tensor (they are small), then sliced: LoRA
``A`` by peft's rule (Kaiming uniform, a = sqrt(5)) and ``B`` as zeros, so the adapted model starts as the
base; another module by its own ``reset_parameters``. Their values therefore differ from a full load's.
A checkpoint whose names the model does not match (other than fresh ones) is :class:`NotShardable`: the
caller falls back to the full load. ``rlhfctl.engine.placement.materialize`` keeps each rank's :class:`LoadReport`
on the model as ``load_report`` (what it read: the tests check that no rank read more than its share).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from huggingface_hub import snapshot_download
from safetensors import safe_open
from torch.distributed.tensor import DTensor, Shard
from transformers import GenerationConfig, PreTrainedModel

from rlhfctl.models.loading import VALUE_HEAD_FILE

__all__ = [
    "CheckpointIndex",
    "LoadReport",
    "NotShardable",
    "ShardedLoad",
    "checkpoint_directory",
    "fresh_full_tensors",
    "load_local_shards",
    "parameters_on_meta",
    "plan_sources",
    "shard_rows",
]

_INDEX_FILE = "model.safetensors.index.json"
_SINGLE_FILE = "model.safetensors"


class NotShardable(ValueError):
    """The checkpoint cannot be read shard by shard into this model (names or shapes differ)."""


@dataclass
class LoadReport:
    """What one rank read from the files: bytes in all, and the largest single read (a slice of one tensor)."""

    bytes_read: int = 0
    largest_read: int = 0
    fresh: list[str] = field(default_factory=list)

    def add(self, tensor: torch.Tensor) -> None:
        """Count one read."""
        size = tensor.numel() * tensor.element_size()
        self.bytes_read += size
        self.largest_read = max(self.largest_read, size)


def checkpoint_directory(model_cfg: Mapping[str, Any]) -> Path | None:
    """The local directory of ``model.path`` when it holds safetensors weights (a hub id: its cached copy), else None."""
    path = model_cfg.get("path")
    if path in (None, ""):
        return None
    local = Path(os.path.expanduser(str(path)))
    if not local.is_dir():
        try:
            local = Path(snapshot_download(str(path), local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the local cache (or not a hub id): the full load reports it
            return None
    return local if (local / _INDEX_FILE).is_file() or (local / _SINGLE_FILE).is_file() else None


class CheckpointIndex:
    """Which file holds each tensor of a Hugging Face directory (``model.safetensors`` or an index of shards)."""

    def __init__(self, directory: Path) -> None:
        if (directory / _INDEX_FILE).is_file():
            weight_map = json.loads((directory / _INDEX_FILE).read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = [_SINGLE_FILE]
        self.location: dict[str, tuple[Path, str]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        sources = [(name, "") for name in files]
        if (directory / VALUE_HEAD_FILE).is_file():
            sources.append((VALUE_HEAD_FILE, "value_head."))
        for name, prefix in sources:
            with safe_open(str(directory / name), framework="pt") as handle:
                for key in handle.keys():
                    self.location[prefix + key] = (directory / name, key)
                    self.shapes[prefix + key] = tuple(handle.get_slice(key).get_shape())

    def find(self, name: str, shape: tuple[int, ...], base_prefix: str) -> str | None:
        """The checkpoint name of model tensor ``name`` with that shape, or None (a fresh tensor)."""
        for candidate in _candidates(name, base_prefix):
            if candidate in self.location and self.shapes[candidate] == tuple(shape):
                return candidate
        return None


def _candidates(name: str, base_prefix: str) -> list[str]:
    """Names a model tensor may have in a checkpoint: peft's wrapping removed, the base model prefix
    (``model.``) added or dropped, CausalLMWithValueHead's ``backbone.`` read as the bare model."""
    plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
    names = [plain]
    if plain.startswith("backbone."):
        plain = plain.removeprefix("backbone.")
        names.append(plain)
    if base_prefix and plain.startswith(base_prefix + "."):
        names.append(plain.removeprefix(base_prefix + "."))
    elif base_prefix:
        names.append(f"{base_prefix}.{plain}")
    return names


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Inside the block every new parameter lands on the meta device, while buffers are built for real.

    Under ``torch.device("meta")`` the rotary ``inv_freq`` (a non-persistent buffer, in no checkpoint)
    would be meta too; here it is computed as at init. Each parameter exists on the CPU only while its
    module registers it (one tensor at a time). Not thread-safe: for a worker's model build only.
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, parameter: nn.Parameter | None) -> None:
        if parameter is not None and parameter.device.type != "meta":
            parameter = nn.Parameter(parameter.detach().to("meta"), requires_grad=parameter.requires_grad)
        original(module, name, parameter)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def base_model_prefix(module: nn.Module) -> str:
    """The transformers base model prefix (``model`` for most LMs) of the first submodule that has one."""
    for sub in module.modules():
        prefix = getattr(sub, "base_model_prefix", None)
        if isinstance(prefix, str) and prefix:
            return prefix
    return ""


def plan_sources(module: nn.Module, index: CheckpointIndex, decoder_layers: list[nn.Module]) -> dict[str, str | None]:
    """For each parameter (first name of tied ones): its checkpoint name, or None when fresh. Raises
    :class:`NotShardable` for a tensor of a decoder layer that the files lack, unless it is a LoRA adapter."""
    prefix = base_model_prefix(module)
    in_layers = {id(p) for layer in decoder_layers for p in layer.parameters()}
    sources: dict[str, str | None] = {}
    for name, parameter in module.named_parameters():
        found = index.find(name, tuple(parameter.shape), prefix)
        if found is None and id(parameter) in in_layers and ".lora_" not in name:
            raise NotShardable(f"the checkpoint has no tensor {name!r} of shape {tuple(parameter.shape)}")
        sources[name] = found
    persistent = set(module.state_dict())
    for name, buffer in module.named_buffers():
        found = index.find(name, tuple(buffer.shape), prefix) if name in persistent else None
        if found is not None:
            sources[name] = found
    return sources


def fresh_full_tensors(module: nn.Module, names: list[str], seed: int) -> dict[str, torch.Tensor]:
    """Seeded full values (float32, CPU) of the parameters the checkpoint lacks; call before ``fully_shard``."""
    generator = torch.Generator().manual_seed(seed)
    parameters = dict(module.named_parameters())
    owners = dict(module.named_modules())
    values: dict[str, torch.Tensor] = {}
    for name in names:
        shape = tuple(parameters[name].shape)
        if ".lora_A." in name:
            values[name] = nn.init.kaiming_uniform_(torch.empty(shape), a=math.sqrt(5), generator=generator)
        elif ".lora_B." in name:
            values[name] = torch.zeros(shape)
        else:
            owner_name, _, leaf = name.rpartition(".")
            if not hasattr(owners[owner_name], "reset_parameters"):
                raise NotShardable(f"the checkpoint has no {name!r}, and {type(owners[owner_name]).__name__} cannot initialise it")
            clone = copy.deepcopy(owners[owner_name]).to_empty(device="cpu").float()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(torch.randint(2**31, (1,), generator=generator)))
                clone.reset_parameters()
            values[name] = getattr(clone, leaf).detach()
    return values


def shard_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """``[start, stop)`` of the dim-0 rows FSDP2 gives ``rank`` (``torch.chunk``: ceil(rows / world) each)."""
    per = math.ceil(rows / world) if rows else 0
    start = min(rank * per, rows)
    return start, min(start + per, rows)


def load_local_shards(module: nn.Module, index: CheckpointIndex, sources: dict[str, str | None],
                      fresh: dict[str, torch.Tensor], rank: int, world: int) -> LoadReport:
    """Fill every local shard of the ``fully_shard``-ed ``module`` (emptied, on its device) from the files or ``fresh``."""
    handles: dict[Path, Any] = {}
    report = LoadReport(fresh=sorted(fresh))
    with contextlib.ExitStack() as stack, torch.no_grad():
        def read(key: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
            path, inner = index.location[key]
            if path not in handles:
                handles[path] = stack.enter_context(safe_open(str(path), framework="pt"))
            piece = handles[path].get_slice(inner)
            tensor = piece[start:stop] if start is not None else piece[:]
            report.add(tensor)
            return tensor

        tensors = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        for name, source in sources.items():
            target = tensors[name]
            if isinstance(target, DTensor):
                if tuple(target.placements) != (Shard(0),):
                    raise NotShardable(f"{name} is placed {target.placements}, not Shard(0)")
                local = target.to_local()
                start, stop = shard_rows(target.shape[0], rank, world)
                if local.shape[0] != stop - start:
                    raise RuntimeError(f"{name}: local shard has {local.shape[0]} rows, expected {stop - start}")
                value = fresh[name][start:stop] if source is None else read(source, start, stop)
            else:
                local = target
                value = fresh[name] if source is None else read(source)
            local.copy_(value.to(device=local.device, dtype=local.dtype))
    return report



@dataclass
class ShardedLoad:
    """What a sharded load needs from the meta-built model before ``fully_shard``: the file index, each
    tensor's source, the fresh tensors' values, the real buffers (``to_empty`` wipes them) and the
    checkpoint's generation config."""

    index: CheckpointIndex
    sources: dict[str, str | None]
    fresh: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    directory: Path

    @classmethod
    def prepare(cls, module: nn.Module, directory: Path, decoder_layers: list[nn.Module], seed: int) -> ShardedLoad:
        """Plan the load of ``directory`` into ``module`` (parameters on meta); raises :class:`NotShardable`."""
        index = CheckpointIndex(directory)
        sources = plan_sources(module, index, decoder_layers)
        fresh = fresh_full_tensors(module, [name for name, source in sources.items() if source is None], seed)
        buffers = {name: buffer.detach().clone() for name, buffer in module.named_buffers()}
        return cls(index, sources, fresh, buffers, directory)

    def fill(self, module: nn.Module, rank: int, world: int) -> LoadReport:
        """Into the sharded, emptied ``module``: the buffers back, every local shard read, the generation config."""
        with torch.no_grad():
            for name, buffer in module.named_buffers():
                if name in self.buffers:
                    buffer.copy_(self.buffers[name].to(buffer.device))
        report = load_local_shards(module, self.index, self.sources, self.fresh, rank, world)
        _adopt_generation_config(module, self.directory)
        return report


def _adopt_generation_config(module: nn.Module, directory: Path) -> None:
    """The checkpoint's ``generation_config.json`` on the transformers model, as ``from_pretrained`` reads it."""
    if not (directory / "generation_config.json").is_file():
        return
    for sub in module.modules():
        if isinstance(sub, PreTrainedModel) and getattr(sub, "generation_config", None) is not None:
            config = GenerationConfig.from_pretrained(str(directory))
            if config.pad_token_id is None:
                config.pad_token_id = sub.generation_config.pad_token_id
            sub.generation_config = config
            return
