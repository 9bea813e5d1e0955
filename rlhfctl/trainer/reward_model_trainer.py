"""Reward model: a sequence classifier trained on preference pairs (``algorithm.name: reward_model``).

The trained role is ``roles.reward`` with ``worker: workers.reward_model.RewardModelTrainerWorker``
and a ``model`` section (inline, or the sft stage's model by path). Loss: Bradley-Terry,
``-log sigmoid(r_chosen - r_rejected - algorithm.margin)``. Metrics per step: ``loss``, ``accuracy``,
``margin``, ``grad_norm``, ``lr``; on the held-out pairs ``eval/loss``, ``eval/accuracy`` (share of pairs
ranked the right way round) and ``eval/margin``.
"""

from __future__ import annotations

from typing import Any

import torch

from rlhfctl.algorithms.preference_losses import bradley_terry_loss
from rlhfctl.data.pairs import PreferenceDataset, PreferencePair, collate_reward_pairs
from rlhfctl.protocol import DataProto
from rlhfctl.trainer.metrics import mean_over_ranks
from rlhfctl.trainer.stage_data import preference_dataset
from rlhfctl.trainer.stage_trainer import StageTrainer

__all__ = ["RewardModelTrainer"]


class RewardModelTrainer(StageTrainer):
    """Drives ``reward.train_reward_model`` / ``reward.eval_reward_model`` over preference pairs."""

    algorithm = "reward_model"
    trained_role = "reward"
    record_kind = "preferences"

    def make_dataset(self, records: list[dict[str, Any]], source: str) -> PreferenceDataset:
        """Tokenize preference pairs."""
        return preference_dataset(self.recipe, self.tokenizer, records, source)

    def collate(self, rows: list[PreferencePair]) -> DataProto:
        """``prompt + chosen`` and ``prompt + rejected``, right-padded to one width."""
        return DataProto.from_dict(collate_reward_pairs(rows, self.tokenizer.pad_token_id))

    def train_on(self, rows: list[PreferencePair]) -> dict[str, float]:
        """One ``train_reward_model`` call."""
        return mean_over_ranks(self.trained.train_reward_model(self.collate(rows)))

    def evaluate(self) -> dict[str, float]:
        """``eval/loss``, ``eval/accuracy`` and ``eval/margin`` over all held-out pairs."""
        chosen, rejected = [], []
        for rows in self.eval_chunks():
            scored = self.trained.eval_reward_model(self.collate(rows))
            chosen.append(scored.batch["chosen_score"])
            rejected.append(scored.batch["rejected_score"])
        loss, stats = bradley_terry_loss(torch.cat(chosen), torch.cat(rejected), float(self.recipe.algorithm.margin))
        return {"eval/loss": float(loss), "eval/accuracy": float(stats["accuracy"]), "eval/margin": float(stats["margin"])}
