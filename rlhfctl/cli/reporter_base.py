"""BaseReporter: no-op implementations of every Reporter method, context management, observer adapters."""

from __future__ import annotations

from typing import Any

__all__ = ["BaseReporter", "describe_ranks"]


def describe_ranks(ranks: list[int] | None) -> str:
    """``0-3`` for a contiguous range, ``0,2`` otherwise, ``-`` for none."""
    if not ranks:
        return "-"
    if list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) > 1:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(rank) for rank in ranks)


class BaseReporter:
    """Does nothing; subclasses override what they show. Usable as a context manager (``close`` on exit).

    ``call_started`` / ``call_finished`` make any reporter a worker-group DispatchObserver.
    """

    def run_started(self, info: dict[str, Any]) -> None:
        """The run is set up (output_dir, total_steps, roles...)."""

    def step_started(self, step: int, total: int) -> None:
        """Training step ``step`` of ``total`` begins."""

    def dispatch_started(self, event: Any) -> None:
        """A group call (a DispatchEvent) was launched."""

    def dispatch_finished(self, event: Any) -> None:
        """A group call's results were collected (``event.finished`` is set)."""

    def step_finished(self, step: int, metrics: dict[str, Any]) -> None:
        """Training step ``step`` ended with ``metrics``."""

    def message(self, text: str, level: str = "info") -> None:
        """A free-form line from the trainer; ``level`` is info, warning or error."""

    def run_finished(self, summary: dict[str, Any]) -> None:
        """The run ended normally with ``summary``."""

    def rank_progress(self, reports: list[Any]) -> None:
        """The latest progress of every rank inside its call (RankProgress reports), a few times a second."""

    def close(self) -> None:
        """Release the display (stop live views); safe to call twice."""

    def call_started(self, event: Any) -> None:
        """DispatchObserver adapter for :meth:`dispatch_started`."""
        self.dispatch_started(event)

    def call_finished(self, event: Any) -> None:
        """DispatchObserver adapter for :meth:`dispatch_finished`."""
        self.dispatch_finished(event)

    def __enter__(self) -> "BaseReporter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
