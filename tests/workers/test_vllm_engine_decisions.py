"""The vLLM engine's start-up decisions, without vLLM: the LOCAL_RANK it is built under, eager or CUDA
graphs, the version it needs, and the first-sync probe's tolerance (rlhfctl/rollout/vllm_engine.py)."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

from rlhfctl.rollout import vllm_engine
from rlhfctl.rollout.vllm_engine import VllmRolloutEngine, eager_mode, engine_settings, probe_tolerance


class RecordingLLM:
    """Stands in for ``vllm.LLM``: records its options and the environment it was built under."""

    built: list["RecordingLLM"] = []

    def __init__(self, **options):
        self.options = options
        self.env = {name: os.environ.get(name) for name in ("LOCAL_RANK", "RANK")}
        RecordingLLM.built.append(self)


def unstarted_engine(device: torch.device) -> VllmRolloutEngine:
    """An engine object as ``__init__`` has it just before ``_start`` (no model, no vLLM)."""
    engine = VllmRolloutEngine.__new__(VllmRolloutEngine)
    engine.role, engine.rank, engine.device = "actor", 0, device
    engine.settings = engine_settings({})
    engine.sleep_mode = False
    engine._config_dir = "/nonexistent"
    return engine


@pytest.fixture
def fake_vllm(monkeypatch):
    """A ``vllm`` module whose LLM records, in a world of 8 ranks on one GPU each (torch.cuda.current_device() == 0)."""
    RecordingLLM.built = []
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=RecordingLLM))
    monkeypatch.setattr(vllm_engine, "vllm_version_problem", lambda installed=None: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 8)
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL"):
        monkeypatch.delenv(name, raising=False)  # _start sets them; restored after the test
    return RecordingLLM


@pytest.mark.parametrize("rank", [0, 3])
def test_engine_is_built_with_local_rank_of_the_device_it_uses_and_the_old_value_comes_back(fake_vllm, monkeypatch, rank):
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: rank)
    monkeypatch.setenv("LOCAL_RANK", str(rank))  # what RankInfo.env() sets: the node-local rank
    monkeypatch.setenv("RANK", str(rank))
    llm = unstarted_engine(torch.device("cuda", 0))._start(seed=1, max_model_len=64, dtype="bf16")
    assert llm.env == {"LOCAL_RANK": "0", "RANK": str(rank)}  # the one visible GPU, cuda:0, on every rank
    assert llm.options["distributed_executor_backend"] == "external_launcher"
    assert os.environ["LOCAL_RANK"] == str(rank)  # restored for the rest of the worker


def test_local_rank_is_restored_when_the_engine_fails_to_start_and_absent_stays_absent(fake_vllm, monkeypatch):
    def failing(**options):
        raise ValueError(f"no room (LOCAL_RANK={os.environ.get('LOCAL_RANK')})")

    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 5)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=failing))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ValueError, match=r"LOCAL_RANK=0\)"):
        unstarted_engine(torch.device("cuda", 0))._start(seed=1, max_model_len=64, dtype="bf16")
    assert "LOCAL_RANK" not in os.environ


def test_engine_local_rank_is_the_current_cuda_device_or_the_device_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert vllm_engine.engine_local_rank(torch.device("cuda", 2)) == 2
    assert vllm_engine.engine_local_rank(torch.device("cpu")) == 0


def test_enforce_eager_auto_is_cuda_graphs_on_cuda_and_eager_on_the_cpu(fake_vllm, monkeypatch):
    assert engine_settings({})["enforce_eager"] is None  # the schema's default: auto
    assert eager_mode(None, torch.device("cuda", 0)) is False
    assert eager_mode(None, torch.device("cpu")) is True
    assert eager_mode(True, torch.device("cuda", 0)) is True and eager_mode(False, torch.device("cpu")) is False
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    on_cuda = unstarted_engine(torch.device("cuda", 0))._start(seed=1, max_model_len=64, dtype="bf16")
    on_cpu = unstarted_engine(torch.device("cpu"))._start(seed=1, max_model_len=64, dtype="float32")
    assert on_cuda.options["enforce_eager"] is False and on_cpu.options["enforce_eager"] is True
    # CPU generators cannot rewind, as a chunked prefill of a seeded request needs: no chunking on the CPU.
    assert on_cpu.options["enable_chunked_prefill"] is False and "enable_chunked_prefill" not in on_cuda.options


def test_a_vllm_older_than_the_sync_needs_is_refused_with_both_versions():
    assert vllm_engine.vllm_version_problem("0.32.0") is None and vllm_engine.vllm_version_problem("0.16.0rc2+cpu") is None
    problem = vllm_engine.vllm_version_problem("0.15.1")
    assert "vLLM >= 0.16.0" in problem and "vLLM 0.15.1 is installed" in problem and "\n" not in problem


def test_the_probe_tolerance_is_tight_in_float32_and_looser_in_16_bits():
    assert probe_tolerance("float32") == probe_tolerance("fp32") == 1e-3
    assert probe_tolerance("bf16") == probe_tolerance(torch.float16) == probe_tolerance("auto") == 0.1
