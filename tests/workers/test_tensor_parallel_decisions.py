"""The decisions behind tensor-parallel vLLM and the weight channel, with no engine: the thread binding of an
engine's ranks, when the actor probes the engine, and the weight channel's backend and timeout (issue 35)."""

from __future__ import annotations

import datetime

import torch.distributed as dist

from rlhfctl.rollout.vllm_engine import cpu_thread_binding, probe_due
from rlhfctl.rollout.weight_channel import channel_group, nccl_options


def test_each_rank_of_an_engine_binds_its_own_slice_of_the_nodes_cores():
    # Two ranks on two cores, one engine of TP 2: the binding vLLM was checked with.
    assert cpu_thread_binding([0, 1], 0, 2, 2) == "0|1"
    assert cpu_thread_binding([1, 0], 1, 2, 2) == "0|1"  # both ranks of the engine compute the same string
    # Eight cores, four ranks, two engines of TP 2: ranks 2 and 3 bind the upper half, two cores each.
    assert cpu_thread_binding(list(range(8)), 2, 4, 2) == "4,5|6,7"
    assert cpu_thread_binding(list(range(8)), 1, 4, 2) == "0,1|2,3"
    # One engine over the whole node.
    assert cpu_thread_binding(list(range(4)), 3, 4, 4) == "0|1|2|3"
    # Fewer cores than ranks: ranks share a core round robin rather than getting none.
    assert cpu_thread_binding([0, 1], 3, 4, 2) == "0|1"


def test_the_engine_is_probed_after_the_first_sync_and_once_more_after_its_first_wake():
    assert probe_due(sleep_mode=True, wakes=0, probes=0)  # the first sync, before any sleep
    assert not probe_due(sleep_mode=True, wakes=0, probes=1)  # asleep or awake, not woken yet
    assert probe_due(sleep_mode=True, wakes=1, probes=1)  # weights restored from sleep: probe again
    assert not probe_due(sleep_mode=True, wakes=2, probes=2)  # once, not at every wake
    assert not probe_due(sleep_mode=True, wakes=5, probes=2)
    # Without sleep mode (the CPU, or enable_sleep_mode: false) the engine never wakes: one probe only.
    assert probe_due(sleep_mode=False, wakes=0, probes=0)
    assert not probe_due(sleep_mode=False, wakes=0, probes=1)


def test_the_weight_channel_waits_the_runs_call_timeout_on_nccl_as_on_gloo():
    hour = datetime.timedelta(seconds=3600)
    cuda, cpu = channel_group("cuda", 3600), channel_group("cpu", 3600.0)
    assert (cuda.backend, cuda.timeout) == ("nccl", hour)
    assert (cpu.backend, cpu.timeout) == ("gloo", hour)
    # Made without options, a ProcessGroupNCCL waits NCCL's 10 minutes; the channel's options carry the call timeout.
    assert dist.ProcessGroupNCCL.Options()._timeout == datetime.timedelta(minutes=10)
    assert nccl_options(cuda.timeout)._timeout == hour


def test_a_left_over_shared_memory_segment_of_this_ranks_engine_is_unlinked_and_no_other(tmp_path):
    from rlhfctl.rollout.vllm_engine import _remove_stale_shared_memory

    names = ["-tp:0-[2-3]-cpushm_0", "-tp:0-[2-3]-cpushm_1", "-tp:0-[0-1]-cpushm_1", "psm_1234"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    removed = _remove_stale_shared_memory(3, 2, directory=str(tmp_path))  # rank 3 is the second of engine [2, 3]
    assert removed == [str(tmp_path / "-tp:0-[2-3]-cpushm_1")]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(set(names) - {"-tp:0-[2-3]-cpushm_1"})


def _fake_vllm(monkeypatch, world: int) -> list[dict]:
    """A ``vllm`` whose LLM records its options and environment, in a world of ``world`` ranks (this one rank 1)."""
    import os
    import sys
    import types

    import torch

    from rlhfctl.rollout import vllm_engine

    built: list[dict] = []

    class LLM:
        def __init__(self, **options):
            built.append({"options": options, "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")})

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    monkeypatch.setattr(vllm_engine, "vllm_version_problem", lambda installed=None: None)
    monkeypatch.setattr(vllm_engine, "_engine_group", lambda t: f"group of {t}")
    monkeypatch.setattr(vllm_engine, "_remove_stale_shared_memory", lambda rank, t: [])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: world)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    return built


def _engine(device: str, t: int):
    import torch

    from rlhfctl.rollout.vllm_engine import VllmRolloutEngine, engine_settings

    engine = VllmRolloutEngine.__new__(VllmRolloutEngine)
    engine.role, engine.rank, engine.device = "actor", 1, torch.device(device)
    engine.settings = {**engine_settings({}), "tensor_parallel_size": t}
    engine.tensor_parallel_size, engine.local_rank, engine.local_world_size = t, 1, 2
    engine.sleep_mode, engine._config_dir = False, "/nonexistent"
    return engine


def test_an_engine_over_t_ranks_is_built_for_t_with_the_binding_on_the_cpu_and_no_custom_all_reduce_on_cuda(monkeypatch):
    import os

    import pytest

    built = _fake_vllm(monkeypatch, world=4)
    cpu = _engine("cpu", 2)
    cpu._start(seed=1, max_model_len=64, dtype="float32")
    options = built[-1]["options"]
    assert options["tensor_parallel_size"] == 2 and options["distributed_executor_backend"] == "external_launcher"
    assert built[-1]["bind"] == "0,1|2,3"  # four cores, two local ranks: one engine over both halves
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ  # set for the engine's start only
    assert cpu._prompt_group == "group of 2"
    cuda = _engine("cuda", 2)
    cuda._start(seed=1, max_model_len=64, dtype="bf16")
    assert built[-1]["options"]["disable_custom_all_reduce"] is True and built[-1]["bind"] is None
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 needs a process group whose size it divides; this group has 4"):
        _engine("cpu", 3)._start(seed=1, max_model_len=64, dtype="float32")
    one = _engine("cpu", 1)
    one._start(seed=1, max_model_len=64, dtype="float32")
    assert built[-1]["options"]["tensor_parallel_size"] == 1 and built[-1]["bind"] is None and one._prompt_group is None
