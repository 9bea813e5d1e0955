"""DPOWorker: direct preference optimisation of the policy against a frozen reference.

Loss per pair: ``-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))`` where ``pi_*`` / ``ref_*`` are
the summed log-probs of the chosen / rejected response (end-of-sequence included) under the policy and
the reference (``algorithm.beta``). The reference log-probs come with the batch: the driver gets them
from ``roles.reference`` (a frozen copy of the initial policy) or, for a LoRA actor without a
reference role, from this worker's ``compute_ref_log_prob`` (the adapter disabled).

Batches hold, per side (``chosen_`` / ``rejected_``), the rollout layout of
:func:`rlhfctl.data.pairs.collate_policy_pairs` (``input_ids``, ``attention_mask``, ``responses``,
``response_mask``) plus ``chosen_ref_logp`` and ``rejected_ref_logp`` (B,).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rlhfctl.algorithms.preference_losses import dpo_loss
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import Dispatch, register
from workers.policy_model import PolicyModelWorker, ResponseScoring
from rlhfctl.engine.log_probs import sequence_log_probs
from rlhfctl.engine.offload import on_device
from rlhfctl.engine.placement import serving
from rlhfctl.engine.training import allreduce_mean

__all__ = ["DPOWorker", "POLICY_PAIR_KEYS", "response_logps"]

_SIDE_KEYS = ("input_ids", "attention_mask", "responses", "response_mask")
POLICY_PAIR_KEYS = tuple(f"{side}_{key}" for side in ("chosen", "rejected") for key in _SIDE_KEYS)
_REF_KEYS = ("chosen_ref_logp", "rejected_ref_logp")


def response_logps(
    model: nn.Module, batch: Mapping[str, torch.Tensor], padding_free: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed response log-probs (B,) of the chosen and rejected sides, from one forward pass over both
    (one packed row with ``padding_free``)."""
    both = {key: torch.cat([batch[f"chosen_{key}"], batch[f"rejected_{key}"]]) for key in _SIDE_KEYS}
    log_probs, _ = sequence_log_probs(model, both, temperature=1.0, with_entropy=False, padding_free=padding_free)
    sums = (log_probs * both["response_mask"].to(log_probs.dtype)).sum(-1)
    rows = batch["chosen_input_ids"].shape[0]
    return sums[:rows], sums[rows:]


class DPOWorker(ResponseScoring, PolicyModelWorker):
    """The policy trained on preference pairs: ``train_dpo``, ``eval_dpo``, plus the policy model's set-up,
    checkpoints and export, and ``compute_ref_log_prob`` (a LoRA policy's own reference)."""

    def __init__(self, recipe: Mapping[str, Any], role: str = "actor") -> None:
        super().__init__(recipe, role)
        self.rollout = self.recipe.rollout.settings  # the temperature of compute_ref_log_prob, as the actor's
        self.beta = float(self.recipe.algorithm.beta)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def train_dpo(self, batch: DataProto) -> dict[str, float]:
        """One optimizer step on the pairs; returns rank-averaged ``loss``, ``rewards/*``, ``grad_norm``, ``lr``."""
        lr = self._start_update(batch, POLICY_PAIR_KEYS + _REF_KEYS, "train_dpo", unit="pairs")
        padding_free = self.padding_free(self.module)

        def loss_fn(micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            chosen, rejected = response_logps(self.model, micro, padding_free)
            loss, metrics = dpo_loss(chosen, rejected, micro["chosen_ref_logp"].float(),
                                     micro["rejected_ref_logp"].float(), self.beta)
            return loss, {"loss": loss.detach(), **metrics}

        metrics = self._optimize(
            {key: batch.batch[key] for key in POLICY_PAIR_KEYS + _REF_KEYS}, loss_fn, stream="dpo",
            micro_batch_rows=self.config["micro_batch_size"],
            row_tokens=batch.batch["chosen_attention_mask"].sum(-1) + batch.batch["rejected_attention_mask"].sum(-1),
        )
        return {**allreduce_mean(metrics, self.device), "lr": lr}

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def eval_dpo(self, batch: DataProto) -> DataProto:
        """Per pair: the policy's summed response log-probs ``chosen_logp`` and ``rejected_logp``; no gradients."""
        self._require_model()
        self._require_keys(batch, POLICY_PAIR_KEYS, "eval_dpo")
        self.module.eval()
        padding_free = self.padding_free(self.module)
        step = int(self.config["micro_batch_size"] or len(batch))
        chosen_parts, rejected_parts = [], []
        with serving(self.module, self.engine), torch.no_grad():
            for start in range(0, len(batch), step):
                micro = {key: batch.batch[key][start : start + step].to(self.device) for key in POLICY_PAIR_KEYS}
                chosen, rejected = response_logps(self.module, micro, padding_free)
                chosen_parts.append(chosen.cpu())
                rejected_parts.append(rejected.cpu())
        return DataProto.from_dict({"chosen_logp": torch.cat(chosen_parts), "rejected_logp": torch.cat(rejected_parts)})
