"""Showing a run: the reporters that implement :class:`rlhfctl.trainer.reporting.Reporter`, and ``make_reporter``.

:class:`RichReporter` is a live terminal view (step progress with ETA, the group calls in flight, metrics
per step); :class:`PlainReporter` prints one line per event, for logs and CI; :class:`QuietReporter`
prints nothing but errors. They share the compact per-step metrics line (``metrics_line``). Reporters
also work as worker-group observers (``call_started`` / ``call_finished``) and as context managers that
stop their display on exit.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from rlhfctl.cli.console import print_error
from rlhfctl.single_controller.rank_progress import call_reports, stragglers
from rlhfctl.trainer.reporting import Reporter

__all__ = ["KEY_METRICS", "BaseReporter", "PlainReporter", "QuietReporter", "RichReporter", "describe_ranks", "format_value",
           "key_metrics", "make_reporter", "metrics_line"]

# ---------------------------------------------------------------------------------- the metrics line
#: (label, metric keys tried in order) in display order; metrics that are absent are skipped.
KEY_METRICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward/mean",)),
    ("score", ("score/mean",)),  # the reward function's raw score, before the overlong penalty
    ("acc", ("acc/mean",)),  # where the reward function returns an acc
    ("kl", ("kl", "actor/kl_loss")),
    ("pg_loss", ("actor/pg_loss",)),
    ("vf_loss", ("critic/vf_loss",)),
    ("resp_len", ("response_length/mean",)),
    ("loss", ("loss",)),  # sft, reward_model, dpo
    ("val_reward", ("val/reward/mean",)),
    ("kl_coef", ("kl/coef",)),
    ("eval_loss", ("eval/loss",)),
    ("eval_acc", ("eval/accuracy",)),
    ("step_s", ("time/step",)),
)


def format_value(value: Any) -> str:
    """Numbers to 4 significant digits (tensors and numpy scalars included); others as str."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            pass
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def key_metrics(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, formatted value) for the key metrics present in ``metrics``."""
    shown = []
    for label, keys in KEY_METRICS:
        key = next((key for key in keys if key in metrics), None)
        if key is not None:
            shown.append((label, format_value(metrics[key])))
    return shown


def metrics_line(step: int, total: int | None, metrics: Mapping[str, Any]) -> str:
    """``step 3/40  reward=0.4 kl=0.001 ... step_s=1.2``."""
    head = f"step {step}/{total}" if total else f"step {step}"
    body = " ".join(f"{label}={value}" for label, value in key_metrics(metrics))
    return f"{head}  {body}".rstrip()


# ---------------------------------------------------------------------------------- the base and the choice
def describe_ranks(ranks: list[int] | None) -> str:
    """``0-3`` for a contiguous range, ``0,2`` otherwise, ``-`` for none."""
    if not ranks:
        return "-"
    if list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) > 1:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(rank) for rank in ranks)


class BaseReporter(Reporter):
    """Does nothing (the Reporter protocol's no-op methods); subclasses override what they show.

    Usable as a context manager (``close`` on exit); ``call_started`` / ``call_finished`` make any
    reporter a worker-group DispatchObserver.
    """

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


def make_reporter(quiet: bool, console: Console, verbose: bool = False, err_console: Console | None = None) -> BaseReporter:
    """Quiet with ``quiet``; Rich when ``console`` is a terminal; Plain (one line per event) otherwise."""
    if quiet:
        return QuietReporter(err_console or Console(stderr=True))
    if console.is_terminal:
        return RichReporter(console)
    return PlainReporter(console.file, verbose=verbose)


# ---------------------------------------------------------------------------------- plain
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
        details = " ".join(f"{key}={_plain_flat(value)}" for key, value in info.items())
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
                self._line(f"  {key}: {_plain_flat(value)}")


def _plain_flat(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{key}:{_plain_flat(item)}" for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(_plain_flat(item) for item in value)
    return format_value(value)


def straggler_line(event: Any, progress: Any, median: float, now: float) -> str:
    """``straggler: actor.generate_sequences rank 1 (node 10.0.0.2) 6.1 s, 2.3x the others' median 2.6 s, at 12/24 tokens``."""
    seconds = progress.seconds(now)
    ratio = seconds / median if median > 0 else float("inf")
    at = f", at {progress.done}/{progress.total} {progress.unit}" if progress.total else ""
    return (f"straggler: {event.role}.{event.method} rank {progress.rank} (node {progress.node}) {seconds:.1f} s, "
            f"{ratio:.1f}x the others' median {median:.1f} s{at}")


# ---------------------------------------------------------------------------------- quiet
class QuietReporter(BaseReporter):
    """For ``--quiet``: silent except ``message(..., level="error")``."""

    def __init__(self, err_console: Console) -> None:
        self.err = err_console

    def message(self, text: str, level: str = "info") -> None:
        """Show errors only."""
        if level == "error":
            print_error(self.err, text)


# ---------------------------------------------------------------------------------- rich
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
        details = "  ".join(f"{key}={_rich_flat(value)}" for key, value in info.items())
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
            table.add_row(Text(str(key)), Text(_rich_flat(value)))
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


def _rich_flat(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{key}: {_rich_flat(item)}" for key, item in value.items() if not isinstance(item, dict))
    if isinstance(value, (list, tuple)):
        return ", ".join(_rich_flat(item) for item in value)
    return format_value(value)
