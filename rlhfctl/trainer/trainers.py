"""Which trainer runs a recipe (``algorithm.name``), and the summary a finished run reports."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.stages import MODEL_DIR
from rlhfctl.trainer.ppo_trainer import PPOTrainer, summarize
from rlhfctl.trainer.reporting import Reporter

__all__ = ["ALGORITHMS", "make_trainer", "run_summary"]

ALGORITHMS = ("ppo", "sft", "reward_model", "dpo")


def make_trainer(cfg: DictConfig, reporter: Reporter) -> Any:
    """The trainer for ``cfg.algorithm.name``: PPOTrainer (ppo, the default), SFTTrainer, RewardModelTrainer or DPOTrainer."""
    name = str(cfg.algorithm.get("name") or "ppo")
    if name == "ppo":
        return PPOTrainer(cfg, reporter)
    if name == "sft":
        from rlhfctl.trainer.sft_trainer import SFTTrainer

        return SFTTrainer(cfg, reporter)
    if name == "reward_model":
        from rlhfctl.trainer.reward_model_trainer import RewardModelTrainer

        return RewardModelTrainer(cfg, reporter)
    if name == "dpo":
        from rlhfctl.trainer.dpo_trainer import DPOTrainer

        return DPOTrainer(cfg, reporter)
    raise RecipeError(f"algorithm.name: {name!r} is not one of: {', '.join(ALGORITHMS)}", "algorithm.name", "bad_choice")


def run_summary(trainer: Any) -> dict[str, Any]:
    """The end-of-run summary; a PPO run with ``trainer.export_hf`` also writes ``<output_dir>/model`` first."""
    if not isinstance(trainer, PPOTrainer):
        return trainer.summary()
    summary = summarize(trainer.metrics_log)
    if trainer.cfg.trainer.get("export_hf"):
        model_dir = trainer.output_dir / MODEL_DIR
        summary["model_dir"] = str(trainer.actor.export_hf(str(model_dir)))
    return summary
