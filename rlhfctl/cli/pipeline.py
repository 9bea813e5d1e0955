"""``rlhfctl pipeline``: run RLHF stages (sft, reward model, ppo, dpo) in order, each feeding the next.

What it shows: :class:`RichPipelineView` is a live terminal view (a stage table, a step bar for the running
stage and its latest metrics); :class:`PlainPipelineView` prints one line per event for logs and CI;
:class:`QuietPipelineView` prints nothing. Each is a :class:`rlhfctl.pipeline.PipelineObserver` and
hands the trainer a reporter (:class:`StageReporter`) that forwards the running stage's steps.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, List, Optional, TextIO

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from rlhfctl.cli.console import make_console, resolve_recipe_path, show_library_output
from rlhfctl.cli.errors import guarded
from rlhfctl.cli.reporters import BaseReporter, format_value
from rlhfctl.pipeline import load_pipeline, run_pipeline
from rlhfctl.pipeline.observer import PipelineObserver, StagePlan, StageResult

__all__ = ["PlainPipelineView", "QuietPipelineView", "RichPipelineView", "StageReporter", "make_pipeline_view", "pipeline",
           "step_metrics"]

def pipeline(
    pipeline_file: str = typer.Argument(..., metavar="PIPELINE", show_default=False,
                                        help="pipeline YAML file, or the name of a bundled one (pipeline-quickstart)"),
    overrides: Optional[List[str]] = typer.Argument(
        None, show_default=False, help="output_dir=DIR, or STAGE.KEY=value for a recipe key of one stage (sft.trainer.total_steps=10)"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print nothing but errors"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="show every library's own output (progress bars, warnings)"),
) -> None:
    """Run the stages of PIPELINE in order: each is a recipe plus overrides, and later stages load
    earlier stages' models through `${stages.NAME.output}`.

    Every stage writes `OUTPUT_DIR/STAGE/` (metrics.jsonl, model/, COMPLETE when it finished). All
    recipes are loaded and validated first, data files read and tokenized included, as `rlhfctl validate`
    does: exit 2 before anything trains, listing every problem with its stage and key. On a rerun,
    stages already complete with the same recipe are skipped; a stage that runs again makes the later
    ones run again too. See docs/pipeline.md.

    Examples:

      rlhfctl pipeline recipes/pipeline-quickstart.yaml output_dir=runs/rlhf

      rlhfctl pipeline pipeline-quickstart output_dir=runs/rlhf ppo.trainer.total_steps=60

      rlhfctl pipeline my-pipeline.yaml sft.data.train_files=[demos.jsonl] --quiet

    Exit codes: 0 done, 1 internal error, 2 pipeline/recipe/data/model error, 130 interrupted.
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        spec = load_pipeline(resolve_recipe_path(pipeline_file), list(overrides or []))
        show_library_output(verbose)
        with make_pipeline_view(quiet, console) as view:
            run_pipeline(spec, view)


# ---------------------------------------------------------------------------------- what it shows
STEP_METRICS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "sft": (("loss", ("loss",)), ("eval_loss", ("eval/loss",)), ("tok/s", ("perf/tokens_per_s",)), ("step_s", ("time/step",))),
    "reward_model": (("loss", ("loss",)), ("acc", ("accuracy",)), ("eval_acc", ("eval/accuracy",)), ("step_s", ("time/step",))),
    "dpo": (("loss", ("loss",)), ("margin", ("rewards/margin",)), ("eval_acc", ("eval/accuracy",)), ("step_s", ("time/step",))),
    "ppo": (("reward", ("reward/mean",)), ("kl", ("kl", "actor/kl_loss")), ("pg_loss", ("actor/pg_loss",)),
            ("resp_len", ("response_length/mean",)), ("step_s", ("time/step",))),
}
"""(label, metric keys tried in order) shown after each step, per algorithm."""


def step_metrics(algorithm: str, metrics: Mapping[str, Any]) -> str:
    """``loss=2.31 eval_loss=2.4 ...``: the algorithm's key metrics present in ``metrics``."""
    shown = []
    for label, keys in STEP_METRICS.get(algorithm, STEP_METRICS["ppo"]):
        key = next((key for key in keys if key in metrics), None)
        if key is not None:
            shown.append(f"{label}={format_value(metrics[key])}")
    return " ".join(shown)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{seconds:.1f}s"


class StageReporter(BaseReporter):
    """The trainer's reporter while one stage runs: forwards steps and messages to the pipeline view."""

    def __init__(self, view: "_View", plan: StagePlan) -> None:
        self.view = view
        self.plan = plan

    def step_started(self, step: int, total: int) -> None:
        """Forwarded as the stage's progress."""
        self.view.step_started(self.plan, step, total)

    def step_finished(self, step: int, metrics: dict[str, Any]) -> None:
        """Forwarded with the stage's key metrics."""
        self.view.step_finished(self.plan, step, metrics)

    def message(self, text: str, level: str = "info") -> None:
        """Forwarded, prefixed with the stage name."""
        self.view.message(f"{self.plan.name}: {text}", level)


class _View(PipelineObserver):
    """Stage bookkeeping shared by the views."""

    def __init__(self) -> None:
        self.plans: list[StagePlan] = []
        self.status: dict[str, str] = {}
        self.detail: dict[str, str] = {}

    def stage_reporter(self, plan: StagePlan) -> StageReporter:
        """A reporter that forwards this stage's steps here."""
        return StageReporter(self, plan)

    def step_started(self, plan: StagePlan, step: int, total: int) -> None:
        """A step of the running stage begins."""

    def step_finished(self, plan: StagePlan, step: int, metrics: Mapping[str, Any]) -> None:
        """A step of the running stage ended."""

    def close(self) -> None:
        """Release the display (idempotent)."""

    def __enter__(self) -> "_View":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _final_table(results: list[StageResult], seconds: float) -> Table:
    table = Table(title=f"pipeline finished in {_duration(seconds)}", title_justify="left")
    for column in ("stage", "algorithm", "status", "headline", "time"):
        table.add_column(column)
    table.add_column("model", overflow="fold")
    for result in results:
        style = "green" if result.status == "done" else "yellow"
        time_text = _duration(result.seconds) if result.status == "done" else "-"
        table.add_row(Text(result.name, style="bold"), Text(result.algorithm), Text(result.status, style=style),
                      Text(result.headline), Text(time_text), Text(result.model_dir))
    return table


class RichPipelineView(_View):
    """Live terminal view: the stage table, the running stage's step bar, and its latest metrics."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console)
        self.task: TaskID | None = None
        self.latest = ""
        self.lock = threading.Lock()
        self.live: Live | None = None

    def _render(self) -> RenderableType:
        table = Table(box=None, padding=(0, 2), header_style="dim")
        for column in ("#", "stage", "algorithm", "status", ""):
            table.add_column(column)
        styles = {"pending": "dim", "running": "cyan", "done": "green", "skipped": "yellow", "failed": "bold red"}
        with self.lock:
            for plan in self.plans:
                status = self.status.get(plan.name, "pending")
                table.add_row(Text(str(plan.index + 1)), Text(plan.name, style="bold"), Text(plan.algorithm),
                              Text(status, style=styles.get(status, "")), Text(self.detail.get(plan.name, "")))
            parts: list[RenderableType] = [table]
            if self.task is not None:
                parts += [self.progress, Text(self.latest, style="dim")]
        return Group(*parts)

    def _print(self, text: str, style: str = "") -> None:
        console = self.live.console if self.live is not None else self.console
        console.print(Text(text, style=style), soft_wrap=True)

    def pipeline_started(self, plans: list[StagePlan], output_dir: Path) -> None:
        """Show the planned stages and start the live view."""
        self.plans = plans
        self._print(f"pipeline: {len(plans)} stages ({', '.join(plan.name for plan in plans)}) -> {output_dir}", "bold")
        self.live = Live(get_renderable=self._render, console=self.console, refresh_per_second=4)
        self.live.start()

    def stage_started(self, plan: StagePlan) -> None:
        """Mark the stage running and reset the step bar."""
        with self.lock:
            self.status[plan.name] = "running"
            self.detail[plan.name] = plan.recipe
            if self.task is not None:
                self.progress.remove_task(self.task)
            self.task = self.progress.add_task(plan.name, total=plan.total_steps)
            self.latest = ""

    def step_started(self, plan: StagePlan, step: int, total: int) -> None:
        """Move the bar to the step being trained."""
        if self.task is not None:
            self.progress.update(self.task, total=total, completed=step - 1, description=f"{plan.name} step {step}/{total}")

    def step_finished(self, plan: StagePlan, step: int, metrics: Mapping[str, Any]) -> None:
        """Advance the bar and show the step's key metrics."""
        if self.task is not None:
            self.progress.update(self.task, completed=step)
        with self.lock:
            self.latest = f"step {step}  {step_metrics(plan.algorithm, metrics)}"
            self.detail[plan.name] = f"step {step}/{plan.total_steps}"

    def _ended(self, plan: StagePlan, result: StageResult, status: str) -> None:
        with self.lock:
            self.status[plan.name] = status
            self.detail[plan.name] = result.headline + (f"  ({_duration(result.seconds)})" if status == "done" else "")
            if self.task is not None and status == "done":
                self.progress.remove_task(self.task)
                self.task = None

    def stage_skipped(self, plan: StagePlan, result: StageResult) -> None:
        """Mark the stage complete from an earlier run."""
        self._ended(plan, result, "skipped")

    def stage_finished(self, plan: StagePlan, result: StageResult) -> None:
        """Mark the stage done with its headline metric."""
        self._ended(plan, result, "done")

    def stage_failed(self, plan: StagePlan, error: BaseException) -> None:
        """Mark the stage failed."""
        with self.lock:
            self.status[plan.name] = "failed"
            self.detail[plan.name] = type(error).__name__
        self.close()

    def message(self, text: str, level: str = "info") -> None:
        """A line above the live view."""
        self._print(text if level == "info" else f"{level}: {text}", {"warning": "yellow", "error": "bold red"}.get(level, ""))

    def pipeline_finished(self, results: list[StageResult], seconds: float) -> None:
        """Stop the live view and print the final table."""
        self.close()
        self.console.print(_final_table(results, seconds))

    def close(self) -> None:
        """Stop the live view (idempotent)."""
        if self.live is not None:
            self.live.stop()
            self.live = None


class PlainPipelineView(_View):
    """One line per event (stage started / skipped / finished, each step), then the final table as text."""

    def __init__(self, stream: TextIO, console: Console | None = None) -> None:
        super().__init__()
        self.stream = stream
        self.console = console

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def _position(self, plan: StagePlan) -> str:
        return f"stage {plan.index + 1}/{len(self.plans)} {plan.name}"

    def pipeline_started(self, plans: list[StagePlan], output_dir: Path) -> None:
        """``pipeline: 3 stages (sft, reward, ppo) -> DIR``."""
        self.plans = plans
        self._line(f"pipeline: {len(plans)} stages ({', '.join(plan.name for plan in plans)}) -> {output_dir}")

    def stage_started(self, plan: StagePlan) -> None:
        """``stage 1/3 sft (sft, recipe ...): started``."""
        self._line(f"{self._position(plan)} ({plan.algorithm}, {plan.recipe}): started, {plan.total_steps} steps")

    def step_finished(self, plan: StagePlan, step: int, metrics: Mapping[str, Any]) -> None:
        """``  sft step 3/60  loss=... eval_loss=...``."""
        self._line(f"  {plan.name} step {step}/{plan.total_steps}  {step_metrics(plan.algorithm, metrics)}".rstrip())

    def stage_skipped(self, plan: StagePlan, result: StageResult) -> None:
        """``stage 1/3 sft: skipped (complete)  eval loss 2.1``."""
        self._line(f"{self._position(plan)}: skipped (complete)  {result.headline}")

    def stage_finished(self, plan: StagePlan, result: StageResult) -> None:
        """``stage 1/3 sft: done in 40.1s  eval loss 2.1 -> DIR``."""
        self._line(f"{self._position(plan)}: done in {_duration(result.seconds)}  {result.headline}  -> {result.model_dir}")

    def stage_failed(self, plan: StagePlan, error: BaseException) -> None:
        """``stage 2/3 reward: failed (ErrorType)``."""
        self._line(f"{self._position(plan)}: failed ({type(error).__name__})")

    def message(self, text: str, level: str = "info") -> None:
        """The text, prefixed with the level unless info."""
        self._line(text if level == "info" else f"{level}: {text}")

    def pipeline_finished(self, results: list[StageResult], seconds: float) -> None:
        """The final table."""
        console = self.console or Console(file=self.stream, width=160, highlight=False)
        console.print(_final_table(results, seconds))


class QuietPipelineView(_View):
    """Prints nothing (errors still reach stderr through the command)."""


def make_pipeline_view(quiet: bool, console: Console) -> _View:
    """Quiet with ``quiet``; the live view on a terminal; plain lines otherwise."""
    if quiet:
        return QuietPipelineView()
    if console.is_terminal:
        return RichPipelineView(console)
    return PlainPipelineView(console.file, console)
