"""The dispatch trace: every group call as Chrome trace events (Perfetto, chrome://tracing), and its summary.

Tracks: the driver (pid 0) with a span per group call and its dispatch / collect parts and a span
per training step; one process per worker host set, a thread per rank, with a span per method run.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from rlhfctl.errors import WorkerLost
from rlhfctl.single_controller.worker_group import DispatchEvent, WorkerGroup

TRACE_FILE = "trace.json"
_US = 1_000_000.0


class TraceRecorder:
    """Observes group calls and worker spans, and writes ``trace.json``."""

    def __init__(self) -> None:
        self.calls: list[DispatchEvent] = []
        self.steps: list[tuple[int, float, float]] = []
        self.worker_spans: list[tuple[str, int, str, str, float, float]] = []
        self.step_starts: dict[int, float] = {}
        self._requested: list[tuple[str, Callable[[float | None], list]]] = []

    # DispatchObserver
    def call_started(self, event: DispatchEvent) -> None:
        self.calls.append(event)

    def call_finished(self, event: DispatchEvent) -> None:
        """Nothing to do: the event object is completed in place."""

    def step_started(self, step: int, start: float) -> None:
        """A training step begins (time.time() seconds): where :meth:`take_over` cuts an attempt back."""
        self.step_starts[step] = start

    def record_step(self, step: int, start: float, end: float) -> None:
        """A training step's wall-clock span (time.time() seconds)."""
        self.steps.append((step, start, end))

    def take_over(self, earlier: "TraceRecorder", resumed_at: int) -> None:
        """Put the trace of the run's earlier attempts (before a restart after a lost worker) ahead of this one's,
        cut back to ``resumed_at``, the step this attempt resumed from: the calls of the steps it redoes count once,
        as their metrics are logged once. Spans still on their way from the lost attempt's workers are left out."""
        cutoff = min((start for step, start in earlier.step_starts.items() if step > resumed_at), default=None)

        def kept(start: float) -> bool:
            return cutoff is None or start < cutoff

        self.calls = [event for event in earlier.calls if kept(event.started)] + self.calls
        self.steps = [span for span in earlier.steps if span[0] <= resumed_at] + self.steps
        self.worker_spans = [span for span in earlier.worker_spans if kept(span[4])] + self.worker_spans
        self.step_starts = {**{step: start for step, start in earlier.step_starts.items() if step <= resumed_at},
                            **self.step_starts}

    def drain_workers(self, groups: list[WorkerGroup]) -> None:
        """Fetch the spans each rank recorded; colocated groups share hosts and are drained once."""
        self.request_spans(groups)
        self.flush()

    def request_spans(self, groups: list[WorkerGroup]) -> None:
        """Ask every host for its spans without waiting; :meth:`flush` takes the answers in.

        The trainer asks at the end of each step and takes the answers in at the end of the next one,
        so the driver never waits on a rank for its trace (the request queues behind calls in flight).
        """
        seen: set[int] = set()
        for group in groups:
            hosts = getattr(group, "_hosts", None)
            if id(hosts) in seen:
                continue
            seen.add(id(hosts))
            track = "+".join(sorted(g.role for g in groups if getattr(g, "_hosts", None) is hosts))
            if group.backend == "local":  # ranks run in this process (ray.backend: local, or pool: driver)
                track += " (driver process)"
            self._requested.append((track, group.request_rank_spans()))

    def flush(self, timeout: float | None = None) -> list[str]:
        """Wait (bounded) for the requested spans and add them to the trace; returns the tracks whose process was lost
        meanwhile (a rollout group restarted alone, a worker that died): their last spans are gone with them."""
        requested, self._requested = self._requested, []
        lost = []
        for track, collect in requested:
            try:
                spans = collect(timeout)
            except WorkerLost:
                lost.append(track)
                continue
            for rank, role, method, start, end in spans:
                self.worker_spans.append((track, rank, role, method, start, end))
        return lost

    def to_chrome_trace(self) -> dict[str, Any]:
        """The trace as a Chrome trace-event JSON object."""
        events: list[dict[str, Any]] = [_meta("process_name", 0, 0, "driver"), _meta("thread_name", 0, 0, "controller")]
        for step, start, end in self.steps:
            events.append(_span(f"step {step}", "step", 0, 1, start, end, {}))
        events.append(_meta("thread_name", 0, 1, "steps"))
        for event in self.calls:
            if event.finished is None:
                continue
            name = f"{event.role}.{event.method}"
            args = {"dispatch_mode": event.dispatch_mode, "execute_mode": event.execute_mode,
                    "ranks": len(event.ranks), "rows_per_rank": event.rows_per_rank, "bytes_sent": event.bytes_sent}
            events.append(_span(name, "call", 0, 0, event.started, event.finished, args))
            events.append(_span("dispatch", "dispatch", 0, 0, event.started, event.started + event.dispatch_s, {}))
            events.append(_span("collect", "collect", 0, 0, event.finished - event.collect_s, event.finished, {}))
        tracks = sorted({span[0] for span in self.worker_spans})
        for index, track in enumerate(tracks, start=1):
            events.append(_meta("process_name", index, 0, f"workers: {track}"))
            for rank in sorted({span[1] for span in self.worker_spans if span[0] == track}):
                events.append(_meta("thread_name", index, rank, f"rank {rank}"))
        for track, rank, role, method, start, end in self.worker_spans:
            events.append(_span(f"{role}.{method}", "worker", tracks.index(track) + 1, rank, start, end, {}))
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write(self, output_dir: str | Path) -> Path:
        """Write ``<output_dir>/trace.json``."""
        path = Path(output_dir) / TRACE_FILE
        path.write_text(json.dumps(self.to_chrome_trace()))
        return path


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def _span(name: str, category: str, pid: int, tid: int, start: float, end: float, args: dict) -> dict[str, Any]:
    return {"name": name, "cat": category, "ph": "X", "pid": pid, "tid": tid,
            "ts": start * _US, "dur": max(0.0, end - start) * _US, "args": args}


def summarize_trace(trace: dict[str, Any] | str | Path) -> dict[str, Any]:
    """Calls, total and mean time per ``role.method``, rank imbalance, bytes, and orchestration share."""
    if not isinstance(trace, dict):
        path = Path(trace)
        path = path / TRACE_FILE if path.is_dir() else path
        trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    calls = [e for e in events if e.get("cat") == "call"]
    workers = [e for e in events if e.get("cat") == "worker"]
    steps = [e for e in events if e.get("cat") == "step"]
    per_method: dict[str, dict[str, Any]] = {}
    for call in calls:
        entry = per_method.setdefault(call["name"], {"calls": 0, "total_s": 0.0, "bytes_sent": 0, "rank_s": defaultdict(float)})
        entry["calls"] += 1
        entry["total_s"] += call["dur"] / _US
        entry["bytes_sent"] += call["args"].get("bytes_sent", 0)
        start, end = call["ts"], call["ts"] + call["dur"]
        inside = [w for w in workers if w["name"] == call["name"] and w["ts"] >= start - 1e3 and w["ts"] + w["dur"] <= end + 1e3]
        for span in inside:
            entry["rank_s"][(span["pid"], span["tid"])] += span["dur"] / _US
    methods = {}
    for name, entry in per_method.items():
        rank_times = entry["rank_s"]
        slowest = max(rank_times.values(), default=0.0)
        fastest = min(rank_times.values(), default=0.0)
        methods[name] = {
            "calls": entry["calls"],
            "total_s": round(entry["total_s"], 6),
            "mean_s": round(entry["total_s"] / entry["calls"], 6),
            "slowest_rank_s": round(slowest, 6),
            "fastest_rank_s": round(fastest, 6),
            "imbalance": round(slowest / fastest, 3) if fastest > 0 else None,
            "bytes_sent": entry["bytes_sent"],
        }
    # Slowest-rank compute first: a call's own span on the driver also counts the time it waited behind
    # calls sent before it to the same ranks (the trainer queues the scoring calls behind generation).
    methods = dict(sorted(methods.items(), key=lambda item: (-item[1]["slowest_rank_s"], -item[1]["total_s"])))
    step_total_us = sum(step["dur"] for step in steps)
    # Orchestration: the part of each step during which no worker was computing (driver-side
    # dispatch, collect, serialization, transfer and the driver's own bookkeeping), named by the
    # hand-over it falls in: the worker call that ended before it and the one that started after it.
    idle_us: dict[str, float] = defaultdict(float)
    for step in steps:
        for before, after, length in _idle_gaps(workers, step["ts"], step["ts"] + step["dur"]):
            idle_us[f"{before} -> {after}"] += length
    overhead_us = sum(idle_us.values())
    idle = {boundary: {"total_s": round(total / _US, 6), "per_step_ms": round(total / 1e3 / len(steps), 3)}
            for boundary, total in sorted(idle_us.items(), key=lambda item: -item[1])}
    return {
        "steps": len(steps),
        "calls": len(calls),
        "methods": methods,
        "orchestration_s": round(overhead_us / _US, 6),
        "step_s": round(step_total_us / _US, 6),
        "orchestration_share": round(overhead_us / step_total_us, 4) if step_total_us else None,
        "idle_by_boundary": idle,
    }


STEP_START, STEP_END = "step start", "step end"


def _idle_gaps(spans: list[dict[str, Any]], start: float, end: float) -> list[tuple[str, str, float]]:
    """The parts of [start, end] no span covers, as (call that ended before, call that started after, length)."""
    clipped = sorted((max(start, s["ts"]), min(end, s["ts"] + s["dur"]), s["name"]) for s in spans
                     if s["ts"] < end and s["ts"] + s["dur"] > start)
    gaps, covered_to, last_name = [], start, STEP_START
    for lo, hi, name in clipped:
        if lo > covered_to:
            gaps.append((last_name, name, lo - covered_to))
        if hi >= covered_to:
            covered_to, last_name = hi, name
    if end > covered_to:
        gaps.append((last_name, STEP_END, end - covered_to))
    return gaps


def brief_summary(summary: dict[str, Any], top: int = 3) -> dict[str, str]:
    """A few flat lines of a trace summary for the end-of-run printout."""
    share = summary.get("orchestration_share")
    brief = {"dispatch/calls": str(summary["calls"]),
             "dispatch/orchestration": f"{100 * share:.1f}% of step time" if share is not None else "n/a"}
    in_steps = [(name, entry) for name, entry in summary["methods"].items() if not name.endswith(".init_model")]
    for name, entry in in_steps[:top]:
        imbalance = f", rank imbalance {entry['imbalance']:.2f}x" if entry.get("imbalance") else ""
        calls = f"{entry['calls']} call{'' if entry['calls'] == 1 else 's'}"
        brief[f"dispatch/{name}"] = f"{calls}, {entry['slowest_rank_s']:.2f} s on the ranks{imbalance}"
    return brief
