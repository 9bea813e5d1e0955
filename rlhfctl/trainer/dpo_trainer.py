"""DPO: optimise the policy directly on preference pairs against a frozen reference (``algorithm.name: dpo``).

The trained role is ``roles.actor`` with ``worker: workers.dpo.DPOWorker``. The reference is
``roles.reference`` (a frozen copy of the initial policy: the actor's model section when its own is
null) or, with ``roles.reference: null`` and a LoRA actor, the actor with its adapter disabled. Each step
asks the reference for the summed log-probs of both responses, then calls ``actor.train_dpo``.
Metrics: ``loss``, ``rewards/chosen``, ``rewards/rejected``, ``rewards/margin``, ``rewards/accuracy``,
``grad_norm``, ``lr``; on held-out pairs ``eval/loss``, ``eval/accuracy``, ``eval/margin``.
"""

from __future__ import annotations

from typing import Any

import torch

from rlhfctl.algorithms.preference_losses import dpo_loss
from rlhfctl.data.pairs import PreferenceDataset, PreferencePair, collate_policy_pairs
from rlhfctl.protocol import DataProto
from rlhfctl.trainer.metrics import mean_over_ranks
from rlhfctl.trainer.reporting import Reporter
from rlhfctl.trainer.stage_data import preference_dataset
from rlhfctl.trainer.stage_trainer import StageTrainer

__all__ = ["DPOTrainer"]

_LOG_PROB_KEYS = ("input_ids", "attention_mask", "responses")


class DPOTrainer(StageTrainer):
    """Drives ``reference.compute_ref_log_prob`` then ``actor.train_dpo`` over preference pairs."""

    algorithm = "dpo"
    trained_role = "actor"
    record_kind = "preferences"

    def __init__(self, cfg: Any, reporter: Reporter, groups: Any = None, recipe: Any = None) -> None:
        super().__init__(cfg, reporter, groups, recipe)
        # The reference role, else the trained actor with its LoRA adapter disabled (recipe/resolve decides).
        self.reference = self.groups["reference"] if self.recipe.step.reference_source == "reference" else self.trained

    def make_dataset(self, records: list[dict[str, Any]], source: str) -> PreferenceDataset:
        """Tokenize preference pairs."""
        return preference_dataset(self.recipe, self.tokenizer, records, source)

    def reference_logps(self, tensors: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed reference log-probs (B,) of the chosen and rejected responses, from one call over both."""
        rows = tensors["chosen_input_ids"].shape[0]
        both = DataProto.from_dict(
            {key: torch.cat([tensors[f"chosen_{key}"], tensors[f"rejected_{key}"]]) for key in _LOG_PROB_KEYS},
            meta_info={"temperature": 1.0},
        )
        log_probs = self.reference.compute_ref_log_prob(both).batch["ref_log_prob"]
        mask = torch.cat([tensors["chosen_response_mask"], tensors["rejected_response_mask"]]).to(log_probs.dtype)
        sums = (log_probs * mask).sum(-1)
        return sums[:rows], sums[rows:]

    def collate(self, rows: list[PreferencePair]) -> dict[str, torch.Tensor]:
        """Both responses in the rollout layout."""
        return collate_policy_pairs(rows, self.tokenizer.pad_token_id)

    def train_on(self, rows: list[PreferencePair]) -> dict[str, float]:
        """Reference log-probs, then one ``train_dpo`` call."""
        tensors = self.collate(rows)
        ref_chosen, ref_rejected = self.reference_logps(tensors)
        batch = DataProto.from_dict({**tensors, "chosen_ref_logp": ref_chosen, "rejected_ref_logp": ref_rejected})
        return mean_over_ranks(self.trained.train_dpo(batch))

    def evaluate(self) -> dict[str, float]:
        """The DPO loss and implicit-reward accuracy and margin over all held-out pairs."""
        parts: dict[str, list[torch.Tensor]] = {"chosen": [], "rejected": [], "ref_chosen": [], "ref_rejected": []}
        for rows in self.eval_chunks():
            tensors = self.collate(rows)
            ref_chosen, ref_rejected = self.reference_logps(tensors)
            policy = self.trained.eval_dpo(DataProto.from_dict(tensors))
            parts["chosen"].append(policy.batch["chosen_logp"])
            parts["rejected"].append(policy.batch["rejected_logp"])
            parts["ref_chosen"].append(ref_chosen)
            parts["ref_rejected"].append(ref_rejected)
        joined = {key: torch.cat(values) for key, values in parts.items()}
        loss, stats = dpo_loss(joined["chosen"], joined["rejected"], joined["ref_chosen"], joined["ref_rejected"],
                               float(self.recipe.algorithm.beta))
        return {"eval/loss": float(loss), "eval/accuracy": float(stats["rewards/accuracy"]),
                "eval/margin": float(stats["rewards/margin"])}
