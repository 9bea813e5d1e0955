"""Live per-rank progress inside a call: reports reach the driver while the call runs (real Ray and the local
backend), the rich view draws a bar per rank and marks finished ones, and plain output names a straggler."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from rlhfctl.cli.reporters import BaseReporter, PlainReporter, RichReporter
from rlhfctl.single_controller import (Dispatch, LocalWorkerGroup, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup,
                                       Worker, rank_progress, register)


class CountingWorker(Worker):
    """Counts to ``steps``, reporting each step; ``slow_rank`` takes ``slow_factor`` times longer per step."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def count(self, steps: int, seconds: float, slow_rank: int = -1, slow_factor: float = 1.0) -> int:
        pause = seconds * (slow_factor if self.rank == slow_rank else 1.0)
        for done in range(1, steps + 1):
            time.sleep(pause)
            rank_progress.report(done, steps, "items")
        return self.rank


class Recorder(BaseReporter):
    """Keeps every poll of the board and every call event, with the time they arrived."""

    def __init__(self) -> None:
        self.polls: list[tuple[float, list]] = []
        self.events: list = []

    def rank_progress(self, reports: list) -> None:
        self.polls.append((time.time(), list(reports)))

    def dispatch_finished(self, event) -> None:
        self.events.append(event)


@pytest.fixture(scope="module")
def counting_group(ray_session):
    pool = RayResourcePool([2], name="progress2")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(CountingWorker), role="counter")
    yield group
    group.shutdown()
    pool.release()


def run_watched(group, backend: str, *observers, **call) -> None:
    group.observers.extend(observers)
    try:
        with rank_progress.watch_rank_progress(backend, lambda reports: [o.rank_progress(reports) for o in observers]):
            group.count(**call)
            time.sleep(2 * rank_progress.REPORT_INTERVAL_S)  # one more poll sees the finished reports
    finally:
        for observer in observers:
            group.observers.remove(observer)


@pytest.mark.parametrize("backend", ["ray", "local"])
def test_ranks_report_progress_while_the_call_runs_and_mark_the_end(counting_group, backend):
    group = counting_group if backend == "ray" else LocalWorkerGroup(2, RayClassWithInitArgs(CountingWorker), role="counter")
    recorder = Recorder()
    run_watched(group, backend, recorder, steps=12, seconds=0.1)
    event = recorder.events[-1]
    during = [reports for at, reports in recorder.polls if at < event.finished]
    mine = [p for reports in during for p in rank_progress.call_reports(event, reports)]
    assert {p.rank for p in mine} == {0, 1}
    assert any(0 < p.done < 12 and not p.finished for p in mine)  # seen mid-call, not only at the end
    assert all(p.total == 12 and p.unit == "items" for p in mine)
    last = rank_progress.call_reports(event, recorder.polls[-1][1])
    assert [(p.rank, p.finished, p.done) for p in last] == [(0, True, 12), (1, True, 12)]


def test_a_call_reports_nothing_before_the_quiet_start(monkeypatch):
    # Run default: a quarter second (the suite sets RLHFCTL_PROGRESS_QUIET_S=0 for its short calls).
    monkeypatch.setattr(rank_progress, "QUIET_START_S", 0.3)
    group = LocalWorkerGroup(2, RayClassWithInitArgs(CountingWorker), role="counter")
    short, long = Recorder(), Recorder()
    run_watched(group, "local", short, steps=4, seconds=0.01)  # 40 ms: over before anything is sent
    assert [p for _, reports in short.polls for p in reports] == []
    run_watched(group, "local", long, steps=8, seconds=0.1)  # 0.8 s: reports from 0.3 s on
    done = sorted({p.done for _, reports in long.polls for p in reports if p.method == "count"})
    assert done and min(done) >= 3 and max(done) == 8


def test_reports_are_throttled_to_a_few_a_second(counting_group):
    recorder = Recorder()
    run_watched(counting_group, "ray", recorder, steps=200, seconds=0.005)  # 200 reports asked for in ~1 s per rank
    event = recorder.events[-1]
    seen = {(p.rank, p.done) for _, reports in recorder.polls for p in rank_progress.call_reports(event, reports)}
    per_rank = max(sum(1 for rank, _ in seen if rank == r) for r in (0, 1))
    seconds = event.finished - event.started
    assert 2 <= per_rank <= seconds / rank_progress.REPORT_INTERVAL_S + 3  # some arrive, not 200


def test_plain_output_names_a_straggling_rank_with_its_node(counting_group):
    stream = io.StringIO()
    plain, recorder = PlainReporter(stream), Recorder()
    run_watched(counting_group, "ray", plain, recorder, steps=6, seconds=0.1, slow_rank=1, slow_factor=8.0)
    lines = [line for line in stream.getvalue().splitlines() if line.startswith("straggler:")]
    event = recorder.events[-1]
    seen = [(round(at - event.started, 2), [(p.rank, p.done, p.finished, round(p.started - event.started, 2))
                                            for p in reports if p.method == "count"]) for at, reports in recorder.polls]
    assert len(lines) == 1, (stream.getvalue(), seen)
    assert lines[0].startswith("straggler: counter.count rank 1 (node ")
    assert "the others' median" in lines[0] and "/6 items" in lines[0]


def test_even_ranks_are_not_stragglers(counting_group):
    stream = io.StringIO()
    run_watched(counting_group, "ray", PlainReporter(stream), steps=6, seconds=0.1)
    assert "straggler" not in stream.getvalue()


def test_the_rich_view_draws_a_bar_per_rank_and_marks_finished_ranks():
    console = Console(file=io.StringIO(), force_terminal=True, width=140, record=True)
    reporter = RichReporter(console)
    from rlhfctl.single_controller import DispatchEvent

    now = time.time()
    event = DispatchEvent(role="actor", method="generate_sequences", dispatch_mode="DP_COMPUTE_PROTO", execute_mode="ALL",
                          ranks=[0, 1], rows_per_rank=[8, 8], started=now - 3)
    reporter.inflight[id(event)] = event
    reporter.rank_progress([
        rank_progress.RankProgress("actor", "generate_sequences", 0, "10.0.0.1", now - 2.9, now - 1, 24, 24, "tokens", True),
        rank_progress.RankProgress("actor", "generate_sequences", 1, "10.0.0.2", now - 2.9, now, 12, 24, "tokens"),
        rank_progress.RankProgress("actor", "update_actor", 1, "10.0.0.2", now - 60, now - 50, 4, 4, "micro-batches", True),
    ])
    console.print(reporter._render())
    text = console.export_text()
    assert "actor.generate_sequences" in text
    rows = [line for line in text.splitlines() if line.strip().startswith("rank ")]
    assert len(rows) == 2  # the earlier update_actor call is not this call's
    assert "rank 0" in rows[0] and "done" in rows[0] and "10.0.0.1" in rows[0]
    assert "rank 1" in rows[1] and "12/24 tokens" in rows[1] and "━" in rows[1]


@pytest.mark.slow
def test_a_training_run_reports_tokens_micro_batches_and_rows_per_rank(ray_session, tmp_path):
    from pathlib import Path

    from rlhfctl.recipe.load import load_recipe
    from rlhfctl.trainer.run import run_training

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
    cfg = load_recipe(str(recipe), [f"trainer.output_dir={tmp_path}", "trainer.total_steps=2", "trainer.batch_size=4",
                                    "trainer.mini_batch_size=2", "rollout.max_new_tokens=16", "data.num_train=8",
                                    "roles.reward.batch_size=4"])
    recorder = Recorder()
    started = time.time()
    run_training(cfg, recorder)
    # The ranks' reports are fire-and-forget messages to the session's board: a short run can end while its
    # last ones are in flight, so the board is read again (bounded) until the three calls' finished reports are in.
    snapshot, _ = rank_progress.start_board("ray")
    deadline = time.time() + 20
    while time.time() < deadline:
        board = [p for p in snapshot() if p.started >= started and p.finished]
        if {(p.role, p.method) for p in board} >= {("actor", "generate_sequences"), ("actor", "update_actor"),
                                                    ("reward", "compute_rewards")}:
            break
        time.sleep(0.2)
    seen: dict = {}  # per call, the furthest report seen (a later call's first reports may be the last polled)
    for _, reports in recorder.polls + [(time.time(), board)]:
        for p in reports:
            if p.started < started:  # the shared session's board still holds earlier tests' runs
                continue
            key = (p.role, p.method)
            if key not in seen or (p.done, p.finished) >= (seen[key].done, seen[key].finished):
                seen[key] = p
    generate = seen[("actor", "generate_sequences")]
    assert generate.unit == "tokens" and generate.total == 16
    update = seen[("actor", "update_actor")]  # mini-batches of 2 prompts x n 4 = 8 of 16 rows, micro-batch = mini-batch
    assert update.unit == "micro-batches" and update.total == 2 and update.done == 2
    reward = seen[("reward", "compute_rewards")]
    assert reward.unit == "rows" and reward.total == 16  # 4 prompts x rollout.n 4
