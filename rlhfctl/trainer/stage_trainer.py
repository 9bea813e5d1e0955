"""The loop shared by the supervised stages (sft, reward_model, dpo), driven from one process.

Per step: take ``trainer.batch_size`` examples (reshuffled every epoch, resumable), collate them, make
one call on the trained role's group (``ALL_TO_ALL``: each rank trains on its shard, DDP averages the
gradients), log the metrics. Evaluation runs every ``trainer.val_every`` steps and at the last step
when there is held-out data. At the end the trained role writes a Hugging Face model directory to
``<output_dir>/model`` (``export_hf``), which a later stage loads through ``model.path``.

Only the roles a stage needs are started (:func:`rlhfctl.recipe.stages.stage_roles`); the others in
the recipe are ignored. Checkpoints (``trainer.save_every``, ``trainer.resume``) use the same layout as
the PPO loop.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig

from rlhfctl.data.batching import PromptBatcher
from rlhfctl.models.loading import ModelConfigError, load_tokenizer
from rlhfctl.recipe.resolved import resolve
from rlhfctl.recipe.specs import Recipe
from rlhfctl.recipe.stages import MODEL_DIR, only_roles, stage_roles
from rlhfctl.run_signals import safe_point_pending
from rlhfctl.trainer.metrics import first_non_finite
from rlhfctl.trainer.reporting import Reporter
from rlhfctl.trainer.role_groups import RoleGroups, build_role_groups
from rlhfctl.trainer.stage_data import stage_records
from rlhfctl.trainer.trainer_base import TrainerBase, TrainingDiverged

__all__ = ["StageTrainer"]


class StageTrainer(TrainerBase):
    """Base of the sft, reward_model and dpo trainers; subclasses say what a step and an evaluation do."""

    algorithm: ClassVar[str] = ""
    trained_role: ClassVar[str] = "actor"
    record_kind: ClassVar[str] = "demonstrations"

    def __init__(self, cfg: DictConfig, reporter: Reporter, groups: RoleGroups | None = None,
                 recipe: Recipe | None = None) -> None:
        self.cfg = cfg  # as written: only saved beside the run (recipe.yaml); everything reads self.recipe
        self.recipe = recipe = recipe if recipe is not None else resolve(cfg)
        self.reporter = reporter
        self.output_dir = Path(recipe.trainer.output_dir)
        self.model_dir = self.output_dir / MODEL_DIR
        if recipe.section_of(self.trained_role) is None or recipe.section_of(self.trained_role).model is None:
            raise ModelConfigError(
                f"roles.{self.trained_role}.model: algorithm.name={self.algorithm} trains this role's model; "
                f"set roles.{self.trained_role}.model.config (inline) or .path"
            )
        model = recipe.role(self.trained_role).model
        self.tokenizer = load_tokenizer(model, trust_remote_code=bool(model.trust_remote_code))
        records = stage_records(recipe, self.record_kind)
        self.train_data = self.make_dataset(records.train, records.train_source)
        self.eval_data = self.make_dataset(records.eval, records.eval_source) if records.eval else None
        self.batcher = PromptBatcher(self.train_data, recipe.trainer.batch_size, seed=recipe.trainer.seed, shuffle=recipe.data.shuffle)
        # The roles this stage does not use are nulled before the groups are built (their workers never start).
        self.groups = groups or build_role_groups(only_roles(cfg, self.roles_used()), call_timeout_s=recipe.trainer.call_timeout_s)
        self.trained = self.groups[self.trained_role]
        self._start_runtime()

    # ------------------------------------------------------------------ what subclasses define
    def roles_used(self) -> set[str]:
        """The roles this stage starts (see :func:`rlhfctl.recipe.stages.stage_roles`)."""
        return set(stage_roles(self.cfg))

    def make_dataset(self, records: list[dict[str, Any]], source: str) -> Any:
        """Tokenize ``records`` into a sequence of examples."""
        raise NotImplementedError

    def train_on(self, rows: list[Any]) -> dict[str, float]:
        """One optimizer step on ``rows``; returns its metrics."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        """Metrics on the held-out examples (keys start with ``eval/``)."""
        raise NotImplementedError

    def eval_chunks(self) -> list[list[Any]]:
        """The held-out examples in chunks of ``trainer.batch_size``."""
        rows = list(self.eval_data or [])
        size = int(self.cfg.trainer.batch_size)
        return [rows[start : start + size] for start in range(0, len(rows), size)]

    # ------------------------------------------------------------------ setup and loop
    def fit(self) -> dict[str, float]:
        """Train to ``trainer.total_steps``, evaluating as configured, then export the model; returns the last metrics."""
        trainer, total = self.cfg.trainer, int(self.cfg.trainer.total_steps)
        metrics: dict[str, float] = {}
        for step in range(self.start_step + 1, total + 1):
            with self.step(step):  # a stop signal waits for the step's end: the step is saved whole
                self.reporter.step_started(step, total)
                step_start = time.time()
                metrics = self.train_step()
                self.record_step_trace(step, step_start, time.time())
                if self.eval_data is not None and (step == total or (trainer.val_every and step % trainer.val_every == 0)):
                    metrics.update(self.evaluate())
                self._check_finite(step, metrics)
                with safe_point_pending():  # logged and done as one
                    self.metrics_log.write(step, metrics)  # every trainer.loggers entry, the console's line included
                    self.completed_step = step
            if trainer.save_every and (step % trainer.save_every == 0 or step == total):
                self.save(step)
        self.export()
        return metrics

    def train_step(self) -> dict[str, float]:
        """One step over the next batch, timed."""
        rows = next(self.batcher)
        start = time.perf_counter()
        metrics = self.train_on(rows)
        metrics["time/step"] = time.perf_counter() - start
        return metrics

    def export(self) -> str:
        """Write the trained model as a Hugging Face directory (``<output_dir>/model``); returns its path."""
        path = self.trained.export_hf(str(self.model_dir))
        self.reporter.message(f"wrote model {path}")
        return str(path)

    def _check_finite(self, step: int, metrics: dict[str, float]) -> None:
        bad = first_non_finite(metrics, ("loss", "grad_norm"))
        if bad is not None:
            raise TrainingDiverged(
                f"step {step}: {bad} is {metrics[bad]} ({self.algorithm}); stopping. Lower the learning rate "
                f"(roles.{self.trained_role}.optim.lr) or check the data."
            )

    # ------------------------------------------------------------------ summary
    def summary(self) -> dict[str, Any]:
        """Steps, first/last training loss, the last evaluation, mean step time, model and metrics paths."""
        records = self.metrics_log.read()
        summary: dict[str, Any] = {"algorithm": self.algorithm, "steps": len(records)}
        losses = [r["loss"] for r in records if isinstance(r.get("loss"), (int, float))]
        if losses:
            summary["loss/first"], summary["loss/last"] = losses[0], losses[-1]
        evaluated = [r for r in records if any(key.startswith("eval/") for key in r)]
        if evaluated:
            summary.update({key: value for key, value in evaluated[-1].items() if key.startswith("eval/")})
        times = [r["time/step"] for r in records if isinstance(r.get("time/step"), (int, float))]
        if times:
            summary["time/step_mean"] = sum(times) / len(times)
        summary["model_dir"] = str(self.model_dir)
        summary["metrics_file"] = str(self.metrics_log.path)
        return summary

    # ------------------------------------------------------------------ checkpoints
    def trainable_groups(self) -> list:
        """The trained role's group."""
        return [self.trained]
