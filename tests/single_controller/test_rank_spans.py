"""Rank spans for the trace: asked for without waiting, taken in later."""

from __future__ import annotations

from rlhfctl.trace import TraceRecorder


def test_asking_for_spans_does_not_wait_for_the_call_in_flight(echo_groups):
    group = echo_groups("ray", 2)
    group.drain_rank_spans()  # forget earlier tests' spans
    recorder = TraceRecorder()
    sleeping = group.submit("sleep", 0.5)
    recorder.request_spans([group])
    assert not sleeping.done()  # the request returned while the ranks still sleep
    assert recorder.worker_spans == []
    recorder.flush(timeout=30)
    spans = sorted((rank, f"{role}.{method}") for _, rank, role, method, _, _ in recorder.worker_spans)
    assert spans == [(0, "echo.sleep"), (1, "echo.sleep")]  # queued behind the sleep, so it is in
    sleeping.get()
