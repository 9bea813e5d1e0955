"""What every trainer (PPO and the stage trainers) shares around its loop: workers, trace, checkpoints, resume, stop."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlhfctl.errors import Diverged
from rlhfctl.run_signals import safe_point_pending, step_in_progress
from rlhfctl.single_controller import WorkerGroupError
from rlhfctl.trace import TraceRecorder, summarize_trace
from rlhfctl.trainer import checkpoint
from rlhfctl.recipe.specs import Recipe
from rlhfctl.trainer.loggers import build_loggers
from rlhfctl.trainer.reporting import Reporter
from rlhfctl.trainer.role_groups import RoleGroups

TRACE_FLUSH_TIMEOUT_S = 60.0


class TrainingDiverged(Diverged):
    """A loss or reward became NaN or infinite; the last good checkpoint is kept."""


class TrainerBase:
    """Base of the PPO and stage trainers; subclasses provide the loop, say which groups train and sum up a run.

    Subclasses set ``cfg`` (the recipe as written, saved beside the run), ``recipe`` (resolved: what every step
    reads), ``reporter``, ``output_dir``, ``batcher`` and ``groups`` in ``__init__``, then call :meth:`_start_runtime`.
    """

    cfg: DictConfig
    recipe: Recipe
    reporter: Reporter
    output_dir: Path
    groups: RoleGroups
    batcher: Any

    def _start_runtime(self) -> None:
        self.start_step = self.completed_step = self.saved_step = 0
        self.running_step: int | None = None  # the step under way: a stop inside it leaves partial state
        self.pending_checkpoint: checkpoint.PendingCheckpoint | None = None  # a save still writing
        # Always recorded (cheap) for the end-of-run summary; written to trace.json when trainer.trace is on.
        self.trace = TraceRecorder()
        for group in self.groups.all():
            group.observers.append(self.trace)

    # ------------------------------------------------------------------ what subclasses define
    def trainable_groups(self) -> list:
        """The groups whose state a checkpoint holds."""
        raise NotImplementedError

    def fit(self) -> dict[str, float]:
        """Run the training steps; returns the last step's metrics."""
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        """The end-of-run summary the CLI prints (and the exports a finished run writes)."""
        raise NotImplementedError

    def batcher_state(self) -> dict[str, Any]:
        """The data order to checkpoint: where the next step's batch comes from."""
        return self.batcher.state_dict()

    def driver_state(self) -> dict[str, Any]:
        """Extra driver-side state to checkpoint (beyond the step and the data position)."""
        return {}

    def restore_driver_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`driver_state` saved."""

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Step ``step`` from its first call to its metrics line: a stop request waits for its end, so the step
        is saved whole and a resumed run goes on exactly where this one stopped (``rlhfctl.run_signals``)."""

        def notice(signal_name: str) -> None:
            self.reporter.message(f"{signal_name}: finishing step {step}, then saving it; send it again to stop at "
                                  f"once (the checkpoint of step {self.saved_step} is kept then)", "warning")

        self.running_step = step
        self.trace.step_started(step, time.time())  # where a restart cuts this attempt's trace back to
        with step_in_progress(notice):
            yield
            self.running_step = None

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Build every role's model (in parallel), then resume if the recipe asks to."""
        futures = [group.init_model.submit() for group in self.groups.all()]
        for future in futures:
            future.get()
        self._write_placement()
        resume_from = checkpoint.resume_point(self.recipe.trainer.resume, self.output_dir)
        if resume_from is not None:
            self._load(resume_from)
        resuming = resume_from is not None or str(self.recipe.trainer.resume) != "never"  # auto with no checkpoint: step 0
        self.metrics_log = build_loggers(self.cfg, self.output_dir, self.reporter,
                                         resume_after_step=self.start_step if resuming else None)
        (self.output_dir / "recipe.yaml").write_text(OmegaConf.to_yaml(self.cfg))

    def _write_placement(self) -> None:
        """``workers.json``: each role's ranks with pid and node, for operators (and the fault tests)."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        placement = {role: group.describe_process() for role, group in self.groups.groups.items()}
        (self.output_dir / "workers.json").write_text(json.dumps(placement, indent=1))

    def record_step_trace(self, step: int, start: float, end: float) -> None:
        """Close a step in the trace, take in the ranks' spans asked for last step, and ask for this step's."""
        self.trace.record_step(step, start, end)
        self.trace.flush()
        self.trace.request_spans(self.groups.all())

    # ------------------------------------------------------------------ checkpoints
    def save(self, step: int) -> Path:
        """Start an atomic checkpoint of every trainable role and the driver's own state; returns where it will be.

        The roles write their sharded state in the background while training goes on; the previous save
        is waited for first, and :meth:`wait_for_checkpoint` waits for this one (the end of the run does).
        """
        self.wait_for_checkpoint()
        state = {"step": step, "batcher": self.batcher_state(), **self.driver_state()}
        groups = self.trainable_groups()

        def save_roles(directory: Path) -> None:
            for group in groups:
                group.save_checkpoint(str(directory), blocking=False)

        def wait_roles() -> None:
            for group in groups:
                group.finish_checkpoint()

        with safe_point_pending():  # a stop signal waits until the roles have their state in hand
            self.pending_checkpoint = checkpoint.start_checkpoint(
                self.output_dir, step, state, save_roles, wait_roles, keep_last=self.recipe.trainer.keep_last)
        self.saved_step = step
        return self.pending_checkpoint.final

    def wait_for_checkpoint(self) -> Path | None:
        """Wait for the checkpoint still being written, then move ``latest`` to it; returns its path (None: none)."""
        pending, self.pending_checkpoint = self.pending_checkpoint, None
        if pending is None:
            return None
        with safe_point_pending():  # a stop signal waits until the checkpoint is whole
            path = pending.complete()
        self.reporter.message(f"saved checkpoint {path}")
        return path

    def _load(self, path: Path) -> None:
        state = checkpoint.load_driver_state(path)
        for group in self.trainable_groups():
            group.load_checkpoint(str(path))
        self.batcher.load_state_dict(state["batcher"])
        self.restore_driver_state(state)
        self.start_step = self.completed_step = self.saved_step = int(state["step"])
        self.reporter.message(f"resumed from {path} at step {self.start_step}")

    # ------------------------------------------------------------------ trace and shutdown
    def write_trace(self) -> Path | None:
        """Write ``trace.json`` when ``trainer.trace`` is on; returns its path."""
        if not self.recipe.trainer.trace:
            return None
        self._flush_trace()
        return self.trace.write(self.output_dir)

    def trace_summary(self) -> dict[str, Any]:
        """The dispatch summary of this run so far (calls, time per method, orchestration share)."""
        self._flush_trace()
        return summarize_trace(self.trace.to_chrome_trace())

    def _flush_trace(self) -> None:
        """Take in the spans still on their way; a rank that cannot answer loses its last step's spans."""
        try:
            lost = self.trace.flush(timeout=TRACE_FLUSH_TIMEOUT_S)
        except WorkerGroupError as error:
            lost = [str(error)]
        if lost:
            self.reporter.message(f"the trace misses the last spans of {', '.join(lost)}: the process was lost")

    def shutdown(self) -> None:
        """Finish a checkpoint still being written (best effort), close the loggers and stop the worker processes."""
        if getattr(self, "pending_checkpoint", None) is not None:  # the run stopped on an error
            try:
                self.wait_for_checkpoint()
            except BaseException as error:  # noqa: BLE001 - the run is failing already; keep the older checkpoint
                self.reporter.message(f"could not finish the last checkpoint ({type(error).__name__}: {error}); "
                                      "the previous one is kept")
        metrics_log = getattr(self, "metrics_log", None)
        if metrics_log is not None:
            metrics_log.close()
        self.groups.shutdown()
