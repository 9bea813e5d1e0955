"""What the pipeline runner reports to: stage events, and a trainer reporter for the running stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

__all__ = ["PipelineObserver", "StagePlan", "StageResult"]


@dataclass
class StagePlan:
    """One stage, ready to run: its resolved recipe and where it writes."""

    index: int
    name: str
    algorithm: str
    directory: Path
    cfg: DictConfig
    fingerprint: str
    recipe: str

    @property
    def total_steps(self) -> int:
        """The stage's ``trainer.total_steps``."""
        return int(self.cfg.trainer.total_steps)


@dataclass
class StageResult:
    """How a stage ended: ``done`` (ran now) or ``skipped`` (complete from an earlier run)."""

    name: str
    algorithm: str
    status: str
    seconds: float
    headline: str
    model_dir: str
    summary: dict[str, Any] = field(default_factory=dict)


class _Silent:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class PipelineObserver:
    """Does nothing; the CLI's views override what they show."""

    def pipeline_started(self, plans: list[StagePlan], output_dir: Path) -> None:
        """Every stage is planned (recipes loaded and checked)."""

    def stage_started(self, plan: StagePlan) -> None:
        """``plan`` starts training."""

    def stage_reporter(self, plan: StagePlan) -> Any:
        """The trainer reporter (``rlhfctl.trainer.reporting.Reporter``) for ``plan``'s steps."""
        return _Silent()

    def stage_skipped(self, plan: StagePlan, result: StageResult) -> None:
        """``plan`` was complete from an earlier run and is not run again."""

    def stage_finished(self, plan: StagePlan, result: StageResult) -> None:
        """``plan`` trained to the end and wrote its model and marker."""

    def stage_failed(self, plan: StagePlan, error: BaseException) -> None:
        """``plan`` stopped with ``error`` (re-raised after this call)."""

    def message(self, text: str, level: str = "info") -> None:
        """A line for the user (level: info, warning)."""

    def pipeline_finished(self, results: list[StageResult], seconds: float) -> None:
        """Every stage is done or skipped."""
