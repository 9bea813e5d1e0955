"""What a group call costs when nobody watches, and what observers see when they do; the rank-side call context."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import rank_progress
from rlhfctl.single_controller import worker_group as worker_group_module


class EventLog:
    """A DispatchObserver keeping every event it is handed, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    def call_started(self, event) -> None:
        self.seen.append(("started", event))

    def call_finished(self, event) -> None:
        self.seen.append(("finished", event))


def test_a_call_with_no_observer_builds_no_event(echo_groups, monkeypatch):
    group = echo_groups("local", 2)
    built = []
    original = worker_group_module.DispatchEvent
    monkeypatch.setattr(worker_group_module, "DispatchEvent", lambda **fields: built.append(fields) or original(**fields))
    assert group.rank_and_arg("v") == [(0, "v", None), (1, "v", None)]
    assert built == []
    group.observers.append(EventLog())
    try:
        group.rank_and_arg("v")
    finally:
        group.observers.clear()
    assert len(built) == 1


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_an_observer_sees_one_event_started_then_finished_with_ranks_rows_and_bytes(echo_groups, backend):
    group = echo_groups(backend, 2)
    batch = DataProto.from_dict(tensors={"x": torch.arange(6, dtype=torch.float32)},
                                non_tensors={"tag": np.array([f"row{i}" for i in range(6)], dtype=object)})
    log = EventLog()
    group.observers.append(log)
    try:
        group.times_ten(batch)
        group.only_rank_zero("v")
    finally:
        group.observers.remove(log)
    (kind1, sharded), (kind2, same), (kind3, rank_zero), (kind4, _) = log.seen
    assert (kind1, kind2, kind3, kind4) == ("started", "finished", "started", "finished")
    assert sharded is same
    assert (sharded.role, sharded.method, sharded.dispatch_mode, sharded.execute_mode) == ("echo", "times_ten", "ALL_TO_ALL", "ALL")
    assert sharded.ranks == [0, 1] and sharded.rows_per_rank == [3, 3]
    assert sharded.bytes_sent == batch.nbytes() > 0
    assert sharded.finished >= sharded.started and sharded.dispatch_s >= 0 and sharded.collect_s >= 0
    assert rank_zero.ranks == [0] and rank_zero.rows_per_rank is None


def test_a_call_that_never_reports_sends_nothing_and_restores_the_outer_call(monkeypatch):
    sent = []
    monkeypatch.setitem(rank_progress._sink_state, "local_board", None)
    monkeypatch.setitem(rank_progress._sink_state, "sink", sent.append)
    monkeypatch.setattr(rank_progress, "QUIET_START_S", 0.0)
    with rank_progress.calling("actor", "update_actor", 1):
        with rank_progress.calling("actor", "inner", 1):
            pass
        assert sent == []  # the inner call reported nothing, so no finished report either
        rank_progress.report(2, 4, "micro-batches")  # belongs to the outer call again
    first, last = sent
    assert (first.method, first.rank, first.done, first.total, first.finished) == ("update_actor", 1, 2, 4, False)
    assert (last.method, last.done, last.finished) == ("update_actor", 2, True)
    assert last.started == first.started <= first.updated <= last.updated
