"""The prepared GPU check's engine part, run on CPU at a tiny size so the script cannot rot unnoticed.

A machine with a GPU is lent to a session only now and then, for minutes; a script that breaks on an
API change would waste that time. ``engine_check(device="cpu")`` runs the same recipe, plan, rollout and
update as on CUDA, without the CUDA memory figures.
"""

from __future__ import annotations

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


def test_the_engine_check_trains_float32_masters_under_bf16_compute_on_cpu(gpu_check, own_process_group):
    results = gpu_check.engine_check(prompts=2, samples=2, response=8, model_config=TINY_QWEN, device="cpu")
    assert results["engine_master_dtypes"] == ["torch.float32"]
    assert results["engine_masters_moved"] is True  # lr 1e-6 under bf16 compute still moves the masters
    assert 0 < results["engine_rollout_tokens"] <= 2 * 2 * 8
    assert results["engine_grad_norm"] > 0
    # The check's own count is float32 weights, gradients and AdamW state (16 bytes a parameter) plus the
    # bf16 copy sampling gathers (2); the plan's state is the first part of it, to the byte.
    assert results["engine_plan_state_gib"] == pytest.approx(results["engine_predicted_state_gib"] * 16 / 18, rel=1e-9)
    assert results["engine_plan_device_gib"] >= results["engine_plan_state_gib"]
    assert "engine_max_allocated_gib" not in results  # CUDA-only figures stay out on CPU


def test_the_check_exits_2_without_cuda(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu_check.py"])
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main()
    assert stopped.value.code == 2
    assert "no CUDA device" in capsys.readouterr().out
