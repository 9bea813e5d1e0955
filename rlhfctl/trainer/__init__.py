"""The controller loop: PPO-family training driven from one process over role worker groups."""

from rlhfctl.trainer.ppo_trainer import PPOTrainer, TrainingDiverged
from rlhfctl.trainer.run import run_training

__all__ = ["PPOTrainer", "TrainingDiverged", "run_training"]
