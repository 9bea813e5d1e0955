"""The controller loop: PPO-family training driven from one process over role worker groups.

The trainer classes are imported on first use, so that light pieces (``rlhfctl.trainer.reporting``, the
protocol the CLI's reporters implement) can be imported without torch.
"""

from __future__ import annotations

from rlhfctl.lazy_exports import lazy_exports

__all__ = ["PPOTrainer", "TrainingDiverged", "run_training"]

_LAZY = {
    "PPOTrainer": "rlhfctl.trainer.ppo_trainer",
    "TrainingDiverged": "rlhfctl.trainer.trainer_base",
    "run_training": "rlhfctl.trainer.run",
}


__getattr__ = lazy_exports(__name__, _LAZY)
