"""Where a run's metrics go (``trainer.loggers``): the console, metrics.jsonl, TensorBoard, W&B, MLflow.

Every step's metrics, validation ones included, go to every logger the recipe lists, through one
:class:`RunLoggers`. ``jsonl`` is the run's own record (the end-of-run summary and ``resume`` read it);
the others are views of the same numbers. TensorBoard, W&B and MLflow are optional extras: a logger
whose package is missing is a recipe error before launch (:func:`rlhfctl.recipe.check_runtime.check_loggers`), naming the extra.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlhfctl.recipe.check_runtime import listed_loggers
from rlhfctl.trainer.metrics import MetricsLog

__all__ = ["RunLoggers", "build_loggers"]

TENSORBOARD_DIR = "tensorboard"


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a step's metrics (what TensorBoard, W&B and MLflow can plot)."""
    scalars = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value)):
            scalars[key] = float(value)
    return scalars


class ConsoleLogger:
    """The per-step line (every ``log_every`` steps and the last), and warnings a user must see."""

    def __init__(self, reporter: Any, log_every: int, total_steps: int) -> None:
        self.reporter, self.log_every, self.total_steps = reporter, log_every, total_steps
        self._warned_reward_errors = False

    def shows(self, step: int) -> bool:
        """Whether ``step`` is one the console reports."""
        return step % self.log_every == 0 or step == self.total_steps

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if self.shows(step):
            self.reporter.step_finished(step, metrics)
        errors = float(metrics.get("reward/errors", 0) or 0)
        if errors > 0 and (self.shows(step) or not self._warned_reward_errors):
            self._warned_reward_errors = True
            self.reporter.message(f"step {step}: the reward function failed on {errors:g} samples, which scored 0 "
                                  "(roles.reward.on_error: zero); the errors are in the worker log", "warning")

    def text(self, step: int, tag: str, texts: list[str]) -> None:
        if self.shows(step) and texts:
            self.reporter.message(f"{tag.rstrip('s')} (step {step}): {texts[0]}")

    def close(self) -> None:
        """Nothing to release."""


class TensorBoardLogger:
    """Event files under ``output_dir/tensorboard/``: every scalar at its step, samples as text."""

    def __init__(self, output_dir: Path, resume_after_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # tensorboard is optional

        # purge_step drops events a resumed run is about to write again (those past its checkpoint).
        purge = resume_after_step + 1 if resume_after_step is not None else None
        self.writer = SummaryWriter(log_dir=str(output_dir / TENSORBOARD_DIR), purge_step=purge)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in _scalars(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def text(self, step: int, tag: str, texts: list[str]) -> None:
        # TensorBoard renders text as Markdown: each sample a paragraph, kept verbatim as code.
        self.writer.add_text(tag, "\n\n".join(f"`{text}`" for text in texts), global_step=step)

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A Weights & Biases run (files under ``output_dir/wandb``; project from WANDB_PROJECT, else rlhfctl)."""

    def __init__(self, output_dir: Path, cfg: DictConfig) -> None:
        import wandb  # wandb is optional

        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "rlhfctl"), dir=str(output_dir),
                              config=OmegaConf.to_container(cfg, resolve=True), name=output_dir.name)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(_scalars(metrics), step=step)

    def text(self, step: int, tag: str, texts: list[str]) -> None:
        self.run.log({tag: self.wandb.Table(columns=["sample"], data=[[text] for text in texts])}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowLogger:
    """An MLflow run (MLFLOW_TRACKING_URI when set, else a file store in ``output_dir/mlruns``)."""

    def __init__(self, output_dir: Path, cfg: DictConfig) -> None:
        import mlflow  # mlflow is optional

        self.mlflow = mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri((output_dir / "mlruns").resolve().as_uri())
        self.run = mlflow.start_run(run_name=output_dir.name)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.mlflow.log_metrics(_scalars(metrics), step=step)

    def text(self, step: int, tag: str, texts: list[str]) -> None:
        self.mlflow.log_text("\n\n".join(texts), f"{tag}/step_{step}.txt")

    def close(self) -> None:
        self.mlflow.end_run()


class RunLoggers:
    """The loggers of one run; ``read``/``path`` give back the steps written (for the summary)."""

    def __init__(self, jsonl: MetricsLog, others: list[Any], keep_jsonl: bool) -> None:
        self.jsonl, self.others, self.keep_jsonl = jsonl, others, keep_jsonl
        self._records: list[dict[str, Any]] = []

    @property
    def path(self) -> Path:
        """The metrics.jsonl file (written only when ``jsonl`` is listed)."""
        return self.jsonl.path

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """One step's metrics to every logger."""
        if self.keep_jsonl:
            self.jsonl.write(step, metrics)
        else:
            self._records.append({"step": step, **metrics})
        for logger in self.others:
            logger.write(step, metrics)

    def text(self, step: int, tag: str, texts: list[str]) -> None:
        """Text records (sample completions) to the loggers that show text; the console shows the first."""
        for logger in self.others:
            logger.text(step, tag, texts)

    def read(self) -> list[dict[str, Any]]:
        """Every step written by this run (and the resumed-from one when ``jsonl`` is on)."""
        return self.jsonl.read() if self.keep_jsonl else list(self._records)

    def close(self) -> None:
        """Flush and close every logger."""
        for logger in self.others:
            logger.close()


def build_loggers(cfg: DictConfig, output_dir: Path, reporter: Any, resume_after_step: int | None) -> RunLoggers:
    """The loggers ``trainer.loggers`` lists (metrics.jsonl is kept in step with a resumed checkpoint)."""
    names = listed_loggers(cfg)
    trainer = cfg.trainer
    others: list[Any] = []
    for name in names:
        if name == "console":
            others.append(ConsoleLogger(reporter, int(trainer.log_every), int(trainer.total_steps)))
        elif name == "tensorboard":
            others.append(TensorBoardLogger(output_dir, resume_after_step))
        elif name == "wandb":
            others.append(WandbLogger(output_dir, cfg))
        elif name == "mlflow":
            others.append(MlflowLogger(output_dir, cfg))
    jsonl = MetricsLog(output_dir, resume_after_step=resume_after_step)
    return RunLoggers(jsonl, others, keep_jsonl="jsonl" in names)
