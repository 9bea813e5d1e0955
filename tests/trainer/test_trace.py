"""The dispatch trace: Chrome trace events for driver and ranks, and the summary numbers."""

from __future__ import annotations

import json

import numpy as np
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup
from rlhfctl.trace import TraceRecorder, summarize_trace
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
    assert list(summary["methods"])[0] == "echo.sleep"  # sorted by total time
