"""PlainReporter: one line per event, for logs and CI (stdout is not a terminal)."""

from __future__ import annotations

import time
from typing import Any, TextIO

from rlhfctl.cli.metrics_line import format_value, metrics_line
from rlhfctl.cli.reporter_base import BaseReporter, describe_ranks
from rlhfctl.single_controller.rank_progress import stragglers

__all__ = ["PlainReporter"]


class PlainReporter(BaseReporter):
    """A line per step with the key metrics; dispatch events too with ``verbose`` (debug)."""

    def __init__(self, stream: TextIO, verbose: bool = False) -> None:
        self.stream = stream
        self.verbose = verbose
        self.total: int | None = None
        self._step_started = 0.0
        self.inflight: dict[int, Any] = {}
        self._straggling: set[tuple[int, int]] = set()  # (call, rank) already reported

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def run_started(self, info: dict[str, Any]) -> None:
        """``run started: key=value ...``."""
        self.total = info.get("total_steps", self.total)
        details = " ".join(f"{key}={_flat(value)}" for key, value in info.items())
        self._line(f"run started: {details}".rstrip())

    def step_started(self, step: int, total: int) -> None:
        """Remember the total; a line only when verbose."""
        self.total = total
        self._step_started = time.time()
        if self.verbose:
            self._line(f"step {step}/{total} started")

    def dispatch_started(self, event: Any) -> None:
        """``-> role.method MODE ranks=0-1 rows/rank=8`` when verbose."""
        self.inflight[id(event)] = event
        if self.verbose:
            rows = event.rows_per_rank[0] if event.rows_per_rank else "-"
            self._line(f"  -> {event.role}.{event.method} {event.dispatch_mode} ranks={describe_ranks(event.ranks)} rows/rank={rows}")

    def dispatch_finished(self, event: Any) -> None:
        """``<- role.method 1.23s`` when verbose."""
        self.inflight.pop(id(event), None)
        if self.verbose:
            elapsed = (event.finished or time.time()) - event.started
            self._line(f"  <- {event.role}.{event.method} {elapsed:.2f}s")

    def rank_progress(self, reports: list[Any]) -> None:
        """A line, once per call and rank, for a rank that straggles (see :func:`straggler_line`)."""
        now = time.time()
        for key, event in list(self.inflight.items()):
            for progress, median in stragglers(event, reports, now):
                if (key, progress.rank) not in self._straggling:
                    self._straggling.add((key, progress.rank))
                    self._line(straggler_line(event, progress, median, now))

    def step_finished(self, step: int, metrics: dict[str, Any]) -> None:
        """``step 3/40  reward=... kl=... step_s=...``."""
        self._line(metrics_line(step, self.total, metrics))

    def message(self, text: str, level: str = "info") -> None:
        """The text, prefixed with the level unless info."""
        self._line(text if level == "info" else f"{level}: {text}")

    def run_finished(self, summary: dict[str, Any]) -> None:
        """``run finished``, then one indented ``key: value`` line per entry (readable in a log)."""
        self._line("run finished")
        for key, value in summary.items():
            if not isinstance(value, dict):
                self._line(f"  {key}: {_flat(value)}")


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{key}:{_flat(item)}" for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(_flat(item) for item in value)
    return format_value(value)


def straggler_line(event: Any, progress: Any, median: float, now: float) -> str:
    """``straggler: actor.generate_sequences rank 1 (node 10.0.0.2) 6.1 s, 2.3x the others' median 2.6 s, at 12/24 tokens``."""
    seconds = progress.seconds(now)
    ratio = seconds / median if median > 0 else float("inf")
    at = f", at {progress.done}/{progress.total} {progress.unit}" if progress.total else ""
    return (f"straggler: {event.role}.{event.method} rank {progress.rank} (node {progress.node}) {seconds:.1f} s, "
            f"{ratio:.1f}x the others' median {median:.1f} s{at}")
