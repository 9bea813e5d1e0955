"""The prepared GPU check's engine part, run on CPU at a tiny size so the script cannot rot unnoticed.

A machine with a GPU is lent to a session only now and then, for minutes; a script that breaks on an
API change would waste that time. ``engine_check(device="cpu")`` runs the same recipe, plan, rollout and
update as on CUDA, without the CUDA memory figures.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

TINY_QWEN = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def gpu_check():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gpu_check as module
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture
def own_process_group():
    """FSDP2 at world 1 starts a process group in this process; leave none behind for later tests."""
    import torch.distributed as dist

    started_here = not dist.is_initialized()
    yield
    if started_here and dist.is_initialized():
        dist.destroy_process_group()


def test_the_engine_check_trains_saves_and_reloads_on_cpu(gpu_check, own_process_group):
    results = gpu_check.engine_check(prompts=2, samples=2, response=8, model_config=TINY_QWEN, device="cpu")
    assert results["engine_master_dtypes"] == ["torch.float32"]
    assert results["engine_masters_moved"] is True  # lr 1e-6 under bf16 compute still moves the masters
    assert 0 < results["engine_rollout_tokens"] <= 2 * 2 * 8
    assert results["engine_grad_norm"] > 0
    assert results["engine_reload_bit_equal"] is True  # save, one more update, reload: the same log-probs
    assert results["engine_async_reload_bit_equal"] is True  # the same with the write in the background
    # The measured round follows an untimed one, so AdamW's moments exist as the plan counts them.
    assert results["engine_adam_state_resident_when_measured"] is True
    # The check's own count is float32 weights, gradients and AdamW state (16 bytes a parameter) plus the
    # bf16 copy sampling gathers (2); the plan's state is the first part of it, to the byte.
    assert results["engine_plan_state_gib"] == pytest.approx(results["engine_predicted_state_gib"] * 16 / 18, rel=1e-9)
    # The plan predicts each of the check's phases, and the update holds the most (gradients, activations).
    phases = [results[f"engine_plan_{phase}_gib"] for phase in ("rollout", "log_prob", "update")]
    assert min(phases) >= results["engine_plan_state_gib"] and phases[2] == max(phases)
    assert not any(key.startswith("engine_max_allocated") for key in results)  # CUDA-only figures stay out on CPU


def test_the_lora_check_moves_only_the_adapter_and_reloads_bit_equal(gpu_check, own_process_group):
    results = gpu_check.engine_check(prompts=2, samples=2, response=8, model_config=TINY_QWEN, device="cpu",
                                     lora={"r": 4, "alpha": 8}, prefix="lora")
    assert results["lora_masters_moved"] is True and results["lora_reload_bit_equal"] is True
    assert results["lora_plan_state_gib"] < 0.5 * results["lora_plan_update_gib"]


def test_the_update_peak_is_read_where_the_actor_took_it(gpu_check):
    """update_actor resets CUDA's peak counter when it reports memory/actor/max_allocated_gib, so the counter
    read after the call sees only what followed; the meter keeps the larger of the two."""
    from engine_check import GIB, PhaseMeter

    meter = PhaseMeter("cuda")
    meter.peak_bytes["update"] = 1 * GIB  # what the counter showed after the call
    meter.reported_peak("update", {"memory/actor/max_allocated_gib": 3.5}, "memory/actor/max_allocated_gib")
    assert meter.peak_bytes["update"] == int(3.5 * GIB)
    meter.reported_peak("update", {"memory/actor/max_allocated_gib": 0.5}, "memory/actor/max_allocated_gib")
    assert meter.peak_bytes["update"] == int(3.5 * GIB)  # a smaller report never lowers it
    cpu = PhaseMeter("cpu")
    cpu.reported_peak("update", {"memory/actor/max_allocated_gib": 3.5}, "memory/actor/max_allocated_gib")
    assert cpu.peak_bytes == {}  # CUDA figures only


def test_the_memory_check_flags_a_phase_more_than_10_percent_off_the_plan(gpu_check):
    results = {"engine_max_allocated_over_plan_rollout": 1.05, "engine_max_allocated_over_plan_update": 1.3,
               "engine_max_allocated_over_plan_log_prob": 0.8}
    failures = gpu_check.memory_failures(results)
    assert [failure.split(":")[0] for failure in failures] == ["engine log_prob", "engine update"]


def test_the_check_imports_without_ray_vllm_or_typer():
    """A bare GPU machine has none of them: the script and its engine part must import without."""
    code = ("import sys\nfor name in ('ray', 'vllm', 'typer'): sys.modules[name] = None\n"
            f"sys.path.insert(0, {str(BENCHMARKS)!r})\nimport gpu_check\nprint(gpu_check.engine_check.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "engine_check", done.stderr


def test_the_check_exits_2_without_cuda(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu_check.py"])
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main()
    assert stopped.value.code == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_the_chunked_pass_check_compares_both_passes_on_cpu(gpu_check):
    results = gpu_check.chunked_logprob_check("cpu", tokens=2048, vocab=2048)
    assert results["chunked_tokens"] > results["chunked_chunk_tokens"]  # the head really ran in chunks
    assert results["chunked_max_abs_diff"] <= 1e-5
    # In-process on CPU a peak can hide in memory the allocator already holds (the benchmark itself measures in
    # fresh processes); on CUDA the check reads max_memory_allocated. Here only their presence is pinned.
    assert results["chunked_peak_gib"] >= 0 and results["unchunked_peak_gib"] >= 0
