"""The dispatch summary of a run restarted after a lost worker counts the whole run, each kept step once."""

from __future__ import annotations

import time

from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup
from rlhfctl.trace import TraceRecorder, brief_summary, summarize_trace
from tests.single_controller.sample_workers import EchoWorker


def attempt(steps: range, failing_step: int | None = None) -> TraceRecorder:
    """One attempt of a run: a real group, one ``echo.sleep`` call (the update) per step; ``failing_step`` begins,
    makes its call and never ends (its worker was lost)."""
    group = LocalWorkerGroup(1, ClassWithInitArgs(EchoWorker), role="echo")
    recorder = TraceRecorder()
    group.observers.append(recorder)
    for step in [*steps, *([failing_step] if failing_step else [])]:
        start = time.time()
        recorder.step_started(step, start)
        group.sleep(0.001)
        if step != failing_step:
            recorder.record_step(step, start, time.time())
    recorder.drain_workers([group])
    return recorder


def test_a_restart_from_step_2_after_a_loss_in_step_5_counts_each_of_the_10_steps_once():
    first = attempt(range(1, 5), failing_step=5)  # steps 1-4 done, lost in step 5's update; step 2 saved whole
    second = attempt(range(3, 11))  # resumed from step 2: steps 3-10
    assert summarize_trace(second.to_chrome_trace())["methods"]["echo.sleep"]["calls"] == 8  # what was counted before
    second.take_over(first, resumed_at=2)
    summary = summarize_trace(second.to_chrome_trace())
    assert summary["steps"] == 10
    assert summary["methods"]["echo.sleep"]["calls"] == 10
    assert [span[0] for span in second.steps] == list(range(1, 11))
    assert sorted(second.step_starts) == list(range(1, 11))
    assert brief_summary(summary)["dispatch/echo.sleep"].startswith("10 calls, ")


def test_a_loss_before_any_later_step_began_keeps_the_whole_earlier_attempt():
    first = attempt(range(1, 3))  # steps 1-2 done and saved; lost before step 3 began
    second = attempt(range(3, 5))
    second.take_over(first, resumed_at=2)
    summary = summarize_trace(second.to_chrome_trace())
    assert summary["steps"] == 4 and summary["methods"]["echo.sleep"]["calls"] == 4
    # The earlier attempts' trace is carried on: a second restart cuts the merged one back again.
    third = attempt(range(4, 5))
    third.take_over(second, resumed_at=3)
    assert summarize_trace(third.to_chrome_trace())["methods"]["echo.sleep"]["calls"] == 4
