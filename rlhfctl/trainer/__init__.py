"""The controller loop: PPO-family training driven from one process over role worker groups."""

from rlhfctl.trainer.ppo_trainer import PPOTrainer
from rlhfctl.trainer.run import run_training
from rlhfctl.trainer.trainer_base import TrainingDiverged

__all__ = ["PPOTrainer", "TrainingDiverged", "run_training"]
