"""The Reporter protocol: what a trainer reports a run's progress to (the CLI's reporters implement it).

The trainer calls, in order: ``run_started(info)``, then per step ``step_started(step, total)``, any
number of ``dispatch_started(event)`` / ``dispatch_finished(event)`` (event: a
:class:`rlhfctl.single_controller.DispatchEvent`), ``step_finished(step, metrics)``; ``message(text)``
at any time; ``run_finished(summary)`` at the end. Every method does nothing by default, so a class
that derives from Reporter overrides only what it shows.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Reporter"]


@runtime_checkable
class Reporter(Protocol):
    """What the trainer reports to; see the module docstring for the call order."""

    def run_started(self, info: dict[str, Any]) -> None:
        """The run is set up: output_dir, total_steps, roles (role -> world size), ..."""

    def step_started(self, step: int, total: int) -> None:
        """Step ``step`` (1-based) of ``total`` begins."""

    def dispatch_started(self, event: Any) -> None:
        """A group call was launched (a DispatchEvent)."""

    def dispatch_finished(self, event: Any) -> None:
        """A group call's results were collected (``event.finished`` set)."""

    def step_finished(self, step: int, metrics: dict[str, Any]) -> None:
        """Step ``step`` ended with these metrics (reward/mean, kl, actor/pg_loss, time/step, ...)."""

    def message(self, text: str, level: str = "info") -> None:
        """A line for the user; ``level`` is info, warning or error."""

    def run_finished(self, summary: dict[str, Any]) -> None:
        """The run ended normally with this summary."""

    def rank_progress(self, reports: list[Any]) -> None:
        """The latest progress of every rank inside its call (RankProgress reports), a few times a second."""
