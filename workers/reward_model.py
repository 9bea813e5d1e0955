"""RewardModelTrainerWorker: trains a sequence classifier (one label) on preference pairs.

The loss is Bradley-Terry, ``-log sigmoid(r_chosen - r_rejected - margin)`` with ``algorithm.margin``
(0 by default), averaged over the pairs. Scores are read at the last non-pad token of
``prompt + response`` (right-padded), exactly as :class:`workers.reward.RewardWorker` reads them when the
exported model later scores rollouts through ``roles.reward.model.path``.

It plays the ``reward`` role of a ``reward_model`` recipe: the model is ``roles.reward.model`` (an
inline config, or a path such as the sft stage's model, whose new score head starts from the seed), the
optimizer ``roles.reward.optim``. Batches come from :func:`rlhfctl.data.pairs.collate_reward_pairs`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn
from transformers.utils import logging as hf_logging

from rlhfctl.algorithms.preference_losses import bradley_terry_loss
from rlhfctl.models.loading import load_sequence_classifier
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import Dispatch, register
from rlhfctl.engine.placement import serving
from rlhfctl.engine.packing import packed_sequence_scores
from rlhfctl.engine.offload import on_device
from workers.trainable import TrainableRoleWorker
from rlhfctl.engine.training import allreduce_mean

__all__ = ["PAIR_KEYS", "RewardModelTrainerWorker", "pair_scores"]

PAIR_KEYS = ("chosen_input_ids", "chosen_attention_mask", "rejected_input_ids", "rejected_attention_mask")


def pair_scores(
    model: nn.Module, batch: Mapping[str, torch.Tensor], padding_free: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (B,) of the chosen and the rejected sequences, from one forward pass over both (one packed
    row with ``padding_free``)."""
    input_ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])
    attention_mask = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])
    if padding_free:
        scores = packed_sequence_scores(model, input_ids, attention_mask)
    else:
        scores = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0].float()
    rows = batch["chosen_input_ids"].shape[0]
    return scores[:rows], scores[rows:]


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' load report (missing / unexpected weights) inside the block."""
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous)


class RewardModelTrainerWorker(TrainableRoleWorker):
    """The reward role while it is being trained: ``train_reward_model``, ``eval_reward_model``, ``export_hf``."""

    default_role = "reward"
    counter_names = ("update_calls",)

    def __init__(self, recipe: Mapping[str, Any], role: str = "reward") -> None:
        super().__init__(recipe, role)
        self.model_cfg = self.spec.model
        self.optim_cfg = self.spec.optim
        self.margin = float(self.recipe.algorithm.margin)
        self.update_calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_device
    def init_model(self) -> None:
        """Build tokenizer, sequence classifier (placed by ``roles.reward.strategy``), optimizer and LR scheduler."""
        self._init_trained_model()

    def _build_model(self, model_cfg: Mapping[str, Any]) -> nn.Module:
        with _quiet_transformers():  # from a causal LM the score head is new and lm_head unused, as intended
            return self._load_trained(load_sequence_classifier, model_cfg)

    def _loss(self, micro: dict[str, torch.Tensor], padding_free: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        chosen, rejected = pair_scores(self.model, micro, padding_free)
        loss, metrics = bradley_terry_loss(chosen, rejected, self.margin)
        return loss, {"loss": loss.detach(), **metrics}

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def train_reward_model(self, batch: DataProto) -> dict[str, float]:
        """One optimizer step on the pairs; returns rank-averaged ``loss``, ``accuracy`` (chosen scored
        higher), ``margin`` (mean r_chosen - r_rejected), ``grad_norm`` and ``lr``."""
        lr = self._start_update(batch, PAIR_KEYS, "train_reward_model", unit="pairs")
        padding_free = self.padding_free(self.module)
        metrics = self._optimize(
            {key: batch.batch[key] for key in PAIR_KEYS}, lambda micro: self._loss(micro, padding_free), stream="reward-model",
            row_tokens=batch.batch["chosen_attention_mask"].sum(-1) + batch.batch["rejected_attention_mask"].sum(-1),
        )
        return {**allreduce_mean(metrics, self.device), "lr": lr}

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def eval_reward_model(self, batch: DataProto) -> DataProto:
        """Per pair: ``chosen_score`` and ``rejected_score``; no gradients."""
        self._require_model()
        self._require_keys(batch, PAIR_KEYS, "eval_reward_model")
        self.module.eval()
        with serving(self.module, self.engine), torch.no_grad():
            pairs = {key: batch.batch[key].to(self.device) for key in PAIR_KEYS}
            chosen, rejected = pair_scores(self.module, pairs, self.padding_free(self.module))
        return DataProto.from_dict({"chosen_score": chosen.cpu(), "rejected_score": rejected.cpu()})
