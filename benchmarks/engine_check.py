"""The training engine part of the GPU check: one actor on the Qwen2.5-0.5B shape, phase by phase.

FSDP2 at world 1, bf16 compute over float32 master weights, ``ray.backend: local`` (no Ray, no vLLM). One
untimed round (rollout, log-prob pass, update) runs first: AdamW creates its moments at its first
``step()``, while the memory plan counts them resident from the start, and the first calls pay one-off
costs (kernels, allocator growth). Then each phase runs once more with CUDA's peak-memory counter reset
before it, so its peak can be set beside the memory plan's prediction for the same phase. The update reads
its peak where it is taken: the actor reports ``memory/actor/max_allocated_gib`` from inside
``update_actor`` and resets CUDA's counter there, so the counter read after the call would miss the update's
own peak. Then a sharded save, one more update and a reload, blocking and then asynchronous: the
next-step log-probs must come back bit-equal both times. With ``lora`` the same shape trains a LoRA adapter
instead.

``device="cpu"`` (with a small ``model_config``) runs the same path without the CUDA figures: that is how
``tests/benchmarks/test_gpu_check.py`` keeps this script working on machines with no GPU.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flops import matmul_peak, shares
from rlhfctl.protocol import DataProto
from rlhfctl.recipe.memory_plan import plan_memory
from rlhfctl.recipe.pools import PoolInfo
from rlhfctl.recipe.resolved import resolve_mapping
from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup

# Qwen2.5-0.5B's architecture (config.json of Qwen/Qwen2.5-0.5B-Instruct), built with random weights.
QWEN_05B = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True,
            "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}
# The check's phases and the actor call the memory plan predicts each one for (MemoryPlan.phase_bytes).
PHASES = {"rollout": "actor.generate_sequences", "log_prob": "actor.compute_log_prob", "update": "actor.update_actor"}
GIB = 1 << 30


def engine_recipe(prompts: int, samples: int, response: int, model_config: dict, use_gpu: bool,
                  lora: dict | None = None) -> dict:
    """The engine check's actor recipe: FSDP2, bf16 compute over float32 masters, lr 1e-6, checkpointed layers."""
    actor: dict[str, Any] = {"strategy": "fsdp2", "micro_batch_size": 8, "optim": {"lr": 1e-6},
                             "model": {"config": dict(model_config), "dtype": "bfloat16", "gradient_checkpointing": True}}
    if lora:
        actor["lora"] = dict(lora)
        actor["optim"] = {"lr": 1e-4}
    return {
        "trainer": {"seed": 0, "total_steps": 10, "ppo_epochs": 1, "batch_size": prompts},
        "rollout": {"n": samples, "max_new_tokens": response, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "do_sample": True},
        "resource_pools": {"main": {"use_gpu": use_gpu}},
        "data": {"task": "digits"},
        "roles": {"actor": actor, "reward": {"function": "rlhfctl.tasks.digits:score"}},
    }


class PhaseMeter:
    """Wall time and (on CUDA) the peak allocated bytes of each phase, the counter reset as the phase starts."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self.peak_bytes: dict[str, int] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the block as phase ``name``."""
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        yield
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes[name] = max(self.peak_bytes.get(name, 0), torch.cuda.max_memory_allocated())
        self.seconds[name] = time.perf_counter() - start

    def reported_peak(self, name: str, metrics: dict[str, float], key: str) -> None:
        """Take a peak a call reported of itself (``key`` in GiB) when it is above what the counter shows
        after the call: a call that resets CUDA's counter inside hides its own peak from the counter."""
        if self.device == "cuda" and key in metrics:
            self.peak_bytes[name] = max(self.peak_bytes.get(name, 0), int(metrics[key] * GIB))


def _planned_phases(recipe: dict, on_cuda: bool) -> tuple[Any, dict[str, int]]:
    """The memory plan ``rlhfctl validate`` shows for ``recipe``: rank 0's role entry and its bytes per phase.

    The check runs ``compute_log_prob`` whatever the recipe needs, so the plan is of the recipe taking that pass
    (a second epoch: the plan reads nothing else of ``ppo_epochs``); the workers get ``recipe`` as it is."""
    with_log_probs = {**recipe, "trainer": {**recipe["trainer"], "ppo_epochs": 2}}
    plan = plan_memory(resolve_mapping(with_log_probs), {"main": PoolInfo("main", ("actor",), (1,), on_cuda, 4, None)})
    by_call = plan.phase_bytes("main", 0, allocated_only=True)  # what max_memory_allocated can see
    return plan.roles[0].largest, {phase: by_call[call] for phase, call in PHASES.items() if call in by_call}


def _prompt_batch(prompts: int, seed: int) -> Any:
    ids = torch.randint(5, 60, (prompts, 16), generator=torch.Generator().manual_seed(seed))
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                               non_tensors={"uid": np.asarray([f"p{i}" for i in range(prompts)], dtype=object)})


def _with_advantages(rollout: Any, old: Any, seed: int) -> Any:
    advantages = torch.randn(rollout.batch["responses"].shape, generator=torch.Generator().manual_seed(seed))
    return rollout.union(old).union(DataProto.from_dict({"advantages": advantages}))


def _save_reload_is_bit_equal(group: Any, batch: Any, directory: str, blocking: bool = True) -> bool:
    """Save the shards, take one more step, reload: the next step's log-probs must be the saved ones, bit for bit.

    With ``blocking=False`` the save returns once the state is staged in host memory; the update runs while
    the write goes on in the background, and ``finish_checkpoint`` waits for it before the reload."""
    saved = group.compute_log_prob(batch).batch["old_log_probs"]
    group.save_checkpoint(directory, blocking=blocking)
    group.update_actor(batch)
    if not blocking:
        group.finish_checkpoint()
    group.load_checkpoint(directory)
    return bool(torch.equal(group.compute_log_prob(batch).batch["old_log_probs"], saved))


def _round(group: Any, meter: PhaseMeter | None, prompts: int, seed: int) -> tuple[Any, dict[str, float]]:
    """Rollout, log-prob pass and update (each measured when a meter is given); the update batch and metrics."""
    measure = meter.phase if meter is not None else (lambda name: contextlib.nullcontext())
    with measure("rollout"):
        rollout = group.generate_sequences(_prompt_batch(prompts, seed))
    with measure("log_prob"):
        old = group.compute_log_prob(rollout)
    update = _with_advantages(rollout, old, seed + 1)
    with measure("update"):
        metrics = group.update_actor(update)[0]
    if meter is not None:
        meter.reported_peak("update", metrics, "memory/actor/max_allocated_gib")
    return update, metrics


def _run_phases(group: Any, meter: PhaseMeter, prompts: int) -> tuple[Any, dict[str, float], bool, bool]:
    """One untimed round (AdamW's state appears at its first step, kernels load), then the measured round;
    returns the measured update batch, its metrics, whether the trainable weights moved in it, and whether
    AdamW's state was resident when it began (as the plan counts it)."""
    _round(group, None, prompts, seed=10)
    resident = bool(group.workers[0].optimizer.state)
    before = group.state_fingerprint()[0]
    update, metrics = _round(group, meter, prompts, seed=0)
    return update, metrics, group.state_fingerprint()[0] != before, resident


def engine_check(prompts: int, samples: int, response: int, model_config: dict | None = None,
                 device: str = "cuda", lora: dict | None = None, peak_flops: float | None = None,
                 prefix: str = "engine") -> dict:
    """FSDP2 world 1, bf16 compute, on the Qwen2.5-0.5B shape by default: throughput, MFU, per-phase memory
    against the plan, and a sharded save/reload; keys start with ``prefix``."""
    from workers import ActorWorker  # transformers via the workers: loaded when the check runs, not when gpu_check imports this

    on_cuda = device == "cuda"
    recipe = engine_recipe(prompts, samples, response, model_config or QWEN_05B, use_gpu=on_cuda, lora=lora)
    planned, planned_phases = _planned_phases(recipe, on_cuda)
    if peak_flops is None:
        peak_flops = matmul_peak(4096 if on_cuda else 512, device=device, dtype=torch.bfloat16)
    meter = PhaseMeter(device)
    group = LocalWorkerGroup(1, ClassWithInitArgs(ActorWorker, recipe, "actor"), role="actor")
    try:
        group.init_model()
        worker = group.workers[0]
        count = sum(p.numel() for p in worker.module.parameters())
        update, metrics, moved, adam_resident = _run_phases(group, meter, prompts)
        dtypes = sorted({str(p.dtype) for p in worker.module.parameters() if p.requires_grad})
        with tempfile.TemporaryDirectory() as directory:
            bit_equal = _save_reload_is_bit_equal(group, update, str(Path(directory) / "blocking"))
            async_bit_equal = _save_reload_is_bit_equal(group, update, str(Path(directory) / "async"), blocking=False)
    finally:
        group.shutdown()
    tokens = int(update.batch["response_mask"].sum())
    update_tokens = int(update.batch["attention_mask"].sum())
    mfu = shares(count, peak_flops, update=(update_tokens, meter.seconds["update"]),
                 generate=(tokens, meter.seconds["rollout"]))
    results: dict[str, Any] = {
        "parameters_m": round(count / 1e6, 1), "master_dtypes": dtypes, "rollout_tokens": tokens,
        "rollout_tokens_per_s": tokens / meter.seconds["rollout"],
        "update_tokens_per_s": update_tokens / meter.seconds["update"],
        "bf16_matmul_peak_tflops": peak_flops / 1e12,
        "mfu_generate": mfu["mfu/generate"], "mfu_update": mfu["mfu/update"],
        "grad_norm": metrics["actor/grad_norm"], "masters_moved": moved, "reload_bit_equal": bit_equal,
        "async_reload_bit_equal": async_bit_equal, "adam_state_resident_when_measured": adam_resident,
        "predicted_state_gib": count * (4 + 4 + 8 + 2) / GIB if not lora else None,
        "plan_state_gib": planned.state_bytes / GIB,
        **{f"plan_{phase}_gib": planned_phases[phase] / GIB for phase in PHASES if phase in planned_phases},
    }
    for phase, peak in meter.peak_bytes.items():
        results[f"max_allocated_{phase}_gib"] = peak / GIB
        if planned_phases.get(phase):
            results[f"max_allocated_over_plan_{phase}"] = peak / planned_phases[phase]
    return {f"{prefix}_{key}": value for key, value in results.items()}


def memory_failures(results: dict, prefix: str = "engine", tolerance: float = 0.10) -> list[str]:
    """The phases whose measured peak is more than ``tolerance`` away from the plan's prediction."""
    failures = []
    for phase in PHASES:
        ratio = results.get(f"{prefix}_max_allocated_over_plan_{phase}")
        if ratio is not None and abs(ratio - 1.0) > tolerance:
            failures.append(f"{prefix} {phase}: max_allocated is {ratio:.2f}x the plan (target within {tolerance:.0%})")
    return failures


def timed(function: Callable[[], Any], device: str, repeats: int = 3) -> float:
    """The median seconds of ``function()`` over ``repeats`` calls after one warm-up."""
    function()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
