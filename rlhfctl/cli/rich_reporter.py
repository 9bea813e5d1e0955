"""RichReporter: a live terminal view: step progress with ETA, the group calls in flight, metrics per step."""

from __future__ import annotations

import threading
import time
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from rlhfctl.cli.metrics_line import format_value, key_metrics
from rlhfctl.cli.reporter_base import BaseReporter, describe_ranks
from rlhfctl.single_controller.rank_progress import call_reports

__all__ = ["RichReporter"]

_LEVEL_STYLES = {"info": "", "warning": "yellow", "error": "bold red"}


class RichReporter(BaseReporter):
    """Live view for a terminal; finished steps scroll above it as compact metric lines."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task: TaskID | None = None
        self.total: int | None = None
        self.inflight: dict[int, Any] = {}
        self.reports: list[Any] = []  # the ranks' live progress (RankProgress), from the progress watcher
        self.lock = threading.Lock()
        self.live: Live | None = None

    # ------------------------------------------------------------------ display
    def _render(self) -> RenderableType:
        with self.lock:
            events, reports = list(self.inflight.values()), list(self.reports)
        if not events:
            return self.progress
        table = Table(box=None, padding=(0, 2), show_header=True, header_style="dim")
        for column in ("in flight", "mode", "ranks", "rows/rank", "elapsed"):
            table.add_column(column)
        now = time.time()
        for event in events:
            rows = str(event.rows_per_rank[0]) if event.rows_per_rank else "-"
            mode = event.dispatch_mode + ("" if event.execute_mode == "ALL" else f"/{event.execute_mode}")
            table.add_row(Text(f"{event.role}.{event.method}", style="cyan"), Text(mode), Text(describe_ranks(event.ranks)),
                          Text(rows), Text(f"{now - event.started:.1f}s"))
            for progress in call_reports(event, reports):
                table.add_row(*_rank_row(progress, now))
        return Group(self.progress, table)

    def _ensure_live(self) -> None:
        if self.live is None:
            self.live = Live(get_renderable=self._render, console=self.console, refresh_per_second=4, transient=False)
            self.live.start()

    def _refresh(self) -> None:
        """Redraw now: text printed above the live view is followed by the last drawn frame."""
        if self.live is not None:
            self.live.refresh()

    def _print(self, text: str, style: str = "") -> None:
        console = self.live.console if self.live is not None else self.console
        console.print(Text(text, style=style), soft_wrap=True)

    def _ensure_task(self, total: int | None) -> None:
        if self.task is None:
            self.task = self.progress.add_task("training", total=total)
        elif total is not None:
            self.progress.update(self.task, total=total)

    # ------------------------------------------------------------------ Reporter
    def run_started(self, info: dict[str, Any]) -> None:
        """Print the run's info and start the live view."""
        self.total = info.get("total_steps")
        details = "  ".join(f"{key}={_flat(value)}" for key, value in info.items())
        self._print(f"run started  {details}", "bold")
        self._ensure_task(self.total)
        self._ensure_live()

    def step_started(self, step: int, total: int) -> None:
        """Move the bar to the step being trained."""
        self.total = total
        self._ensure_task(total)
        self.progress.update(self.task, completed=step - 1, description=f"step {step}/{total}")  # type: ignore[arg-type]
        self._ensure_live()
        self._refresh()

    def dispatch_started(self, event: Any) -> None:
        """Show the call as in flight."""
        with self.lock:
            self.inflight[id(event)] = event
        self._refresh()

    def dispatch_finished(self, event: Any) -> None:
        """Drop the call from the in-flight list."""
        with self.lock:
            self.inflight.pop(id(event), None)
        self._refresh()

    def rank_progress(self, reports: list[Any]) -> None:
        """Keep the ranks' latest progress; the next frame draws a bar per rank under its call."""
        with self.lock:
            self.reports = list(reports)

    def step_finished(self, step: int, metrics: dict[str, Any]) -> None:
        """Advance the bar and print the step's key metrics above the live view."""
        self._ensure_task(self.total)
        self.progress.update(self.task, completed=step)  # type: ignore[arg-type]
        self._refresh()
        head = f"step {step}/{self.total}" if self.total else f"step {step}"
        line = Text(head, style="bold")
        for label, value in key_metrics(metrics):
            line.append(f"  {label} ", style="dim")
            line.append(value)
        console = self.live.console if self.live is not None else self.console
        console.print(line, soft_wrap=True)

    def message(self, text: str, level: str = "info") -> None:
        """Print a line above the live view."""
        self._print(text if level == "info" else f"{level}: {text}", _LEVEL_STYLES.get(level, ""))

    def run_finished(self, summary: dict[str, Any]) -> None:
        """Stop the live view and print the summary."""
        self.close()
        table = Table(title="run finished", title_justify="left", show_header=False, box=None, padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        for key, value in summary.items():
            if isinstance(value, dict):
                continue  # nested detail (the full trace summary) is for tools, not the screen
            table.add_row(Text(str(key)), Text(_flat(value)))
        self.console.print(table)

    def close(self) -> None:
        """Stop the live view (idempotent)."""
        with self.lock:
            self.inflight.clear()
        if self.live is not None:
            self.live.stop()
            self.live = None


def _rank_row(progress: Any, now: float) -> tuple[RenderableType, ...]:
    """``  rank 1  [bar] 12/24 tokens  3.1s``, or ``done`` for a rank that finished the call."""
    label = Text(f"  rank {progress.rank}", style="dim")
    seconds = Text(f"{progress.seconds(now):.1f}s", style="dim")
    if progress.finished:
        return label, Text("done", style="green"), Text(progress.node, style="dim"), Text(""), seconds
    bar = ProgressBar(total=max(progress.total, 1), completed=progress.done, width=20)
    return label, bar, Text(progress.node, style="dim"), Text(f"{progress.done}/{progress.total} {progress.unit}"), seconds


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{key}: {_flat(item)}" for key, item in value.items() if not isinstance(item, dict))
    if isinstance(value, (list, tuple)):
        return ", ".join(_flat(item) for item in value)
    return format_value(value)
