"""The dispatch trace: Chrome trace events for driver and ranks, and the summary numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup
from rlhfctl.trace import TraceRecorder, brief_summary, summarize_trace
from tests.single_controller.sample_workers import EchoWorker


def test_trace_has_driver_and_rank_tracks_and_a_consistent_summary(tmp_path):
    group = LocalWorkerGroup(2, ClassWithInitArgs(EchoWorker), role="echo")
    recorder = TraceRecorder()
    group.observers.append(recorder)
    batch = DataProto.from_dict(tensors={"x": torch.zeros(6)}, non_tensors={"tag": np.arange(6)})
    import time

    start = time.time()
    group.shard_of(batch, scale=1)
    group.sleep(0.05)
    recorder.record_step(1, start, time.time())
    recorder.drain_workers([group])
    path = recorder.write(tmp_path)

    trace = json.loads(path.read_text())
    names = {(e["name"], e.get("cat")) for e in trace["traceEvents"]}
    assert ("echo.shard_of", "call") in names and ("echo.sleep", "call") in names
    assert ("dispatch", "dispatch") in names and ("collect", "collect") in names
    worker_spans = [e for e in trace["traceEvents"] if e.get("cat") == "worker"]
    assert sorted((e["name"], e["tid"]) for e in worker_spans) == [
        ("echo.shard_of", 0), ("echo.shard_of", 1), ("echo.sleep", 0), ("echo.sleep", 1)]
    call = next(e for e in trace["traceEvents"] if e["name"] == "echo.shard_of" and e["cat"] == "call")
    assert call["args"]["bytes_sent"] == 6 * 4 + 6 * 8  # float32 x plus the int64 tag column
    assert call["args"]["rows_per_rank"] == [3, 3]

    summary = summarize_trace(tmp_path)
    assert summary["steps"] == 1 and summary["calls"] == 2
    sleep = summary["methods"]["echo.sleep"]
    assert sleep["calls"] == 1 and sleep["slowest_rank_s"] >= 0.05
    assert 0.0 <= summary["orchestration_share"] < 1.0
    assert list(summary["methods"])[0] == "echo.sleep"  # sorted by the slowest rank's compute


def _span(name, cat, pid, tid, start_s, end_s, **args):
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": start_s * 1e6,
            "dur": (end_s - start_s) * 1e6, "args": args}


def test_orchestration_is_step_time_not_covered_by_any_worker():
    trace = {"traceEvents": [
        _span("step 1", "step", 0, 1, 0.0, 10.0),
        _span("actor.generate_sequences", "call", 0, 0, 0.0, 4.0, bytes_sent=100),
        _span("actor.generate_sequences", "worker", 1, 0, 0.5, 3.5),
        _span("actor.generate_sequences", "worker", 1, 1, 0.5, 2.5),
        _span("reward.compute_rewards", "call", 0, 0, 4.0, 9.0, bytes_sent=50),
        _span("reward.compute_rewards", "worker", 2, 0, 4.0, 6.0),
        _span("reward.compute_rewards", "worker", 2, 0, 5.0, 8.0),  # overlaps the span before: counted once
        # Sent with generation and queued behind it: long in flight, short on its rank.
        _span("reference.compute_ref_log_prob", "call", 0, 0, 0.0, 9.5, bytes_sent=0),
        _span("reference.compute_ref_log_prob", "worker", 3, 0, 1.0, 1.5),
    ]}
    summary = summarize_trace(trace)
    # Covered: [0.5, 3.5] + [4, 8] = 7 s of a 10 s step.
    assert summary["orchestration_s"] == 3.0
    assert summary["orchestration_share"] == 0.3
    # The same 3 s, named by the hand-over each idle stretch falls in, largest first.
    assert summary["idle_by_boundary"] == {
        "reward.compute_rewards -> step end": {"total_s": 2.0, "per_step_ms": 2000.0},
        "step start -> actor.generate_sequences": {"total_s": 0.5, "per_step_ms": 500.0},
        "actor.generate_sequences -> reward.compute_rewards": {"total_s": 0.5, "per_step_ms": 500.0},
    }
    generate = summary["methods"]["actor.generate_sequences"]
    assert generate["slowest_rank_s"] == 3.0 and generate["fastest_rank_s"] == 2.0 and generate["imbalance"] == 1.5
    assert generate["bytes_sent"] == 100
    # Sorted by the slowest rank's compute (5, 3, 0.5 s), not by the time in flight (5, 4, 9.5 s).
    assert list(summary["methods"]) == ["reward.compute_rewards", "actor.generate_sequences",
                                        "reference.compute_ref_log_prob"]
    brief = brief_summary(summary)
    assert brief["dispatch/actor.generate_sequences"] == "1 call, 3.00 s on the ranks, rank imbalance 1.50x"


def test_idle_time_is_split_per_hand_over_and_averaged_over_steps():
    trace = {"traceEvents": [
        _span("step 1", "step", 0, 1, 0.0, 1.0),
        _span("actor.generate_sequences", "worker", 1, 0, 0.0, 0.4),
        _span("reference.compute_ref_log_prob", "worker", 1, 0, 0.5, 1.0),
        _span("step 2", "step", 0, 1, 1.0, 2.0),
        _span("actor.generate_sequences", "worker", 1, 0, 1.0, 1.2),
        _span("reward.compute_rewards", "worker", 2, 0, 1.1, 1.3),  # starts inside the span before it
        _span("reference.compute_ref_log_prob", "worker", 1, 0, 1.6, 1.85),
    ]}
    summary = summarize_trace(trace)
    idle = summary["idle_by_boundary"]
    assert list(idle) == ["reward.compute_rewards -> reference.compute_ref_log_prob",  # 0.3 s
                          "reference.compute_ref_log_prob -> step end",  # 0.15 s
                          "actor.generate_sequences -> reference.compute_ref_log_prob"]  # 0.1 s
    assert idle["reward.compute_rewards -> reference.compute_ref_log_prob"]["total_s"] == pytest.approx(0.3)
    assert idle["actor.generate_sequences -> reference.compute_ref_log_prob"]["per_step_ms"] == pytest.approx(50.0)
    assert sum(entry["total_s"] for entry in idle.values()) == pytest.approx(summary["orchestration_s"])
    empty = summarize_trace({"traceEvents": [_span("step 1", "step", 0, 1, 0.0, 1.0)]})
    assert empty["idle_by_boundary"] == {"step start -> step end": {"total_s": 1.0, "per_step_ms": 1000.0}}
