"""CriticWorker: the value model of PPO. Predicts per-token values and fits them to the returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rlhfctl.algorithms import value_loss
from rlhfctl.models.loading import load_token_value_model, token_values
from rlhfctl.protocol import DataProto
from rlhfctl.recipe.resolve import samples_per_rank
from rlhfctl.single_controller import Dispatch, register
from rlhfctl.engine.placement import forwards_are_collective, scoring
from rlhfctl.engine.log_probs import position_ids_from_mask
from rlhfctl.engine.memory import StateObserver
from rlhfctl.engine.micro_batches import loss_token_counts, scoring_slices
from rlhfctl.engine.offload import on_device
from rlhfctl.engine.packing import packed_response_values
from workers.trainable import TrainableRoleWorker
from rlhfctl.engine.training import allreduce_mean

__all__ = ["CriticWorker", "response_values"]

_UPDATE_KEYS = ("input_ids", "attention_mask", "responses", "response_mask", "returns", "values")


def response_values(model: nn.Module, batch: Mapping[str, torch.Tensor], padding_free: bool = False) -> torch.Tensor:
    """Values (B, R) at the response positions: the value for token t is read at position P + t - 1.

    With ``padding_free`` the rows run packed into one (``rlhfctl.engine.packing``); pad cells are then 0.
    """
    response_length = batch["responses"].shape[1]
    position_ids = batch.get("position_ids")
    if position_ids is None:
        position_ids = position_ids_from_mask(batch["attention_mask"])
    if padding_free:
        return packed_response_values(model, batch, position_ids)
    values = token_values(model, batch["input_ids"], batch["attention_mask"], position_ids)
    return values[:, -response_length - 1 : -1].float()


class CriticWorker(TrainableRoleWorker):
    """The critic role: ``compute_values``, ``update_critic`` and checkpoints.

    Its model is ``roles.critic.model``, or a value model built from the actor's model section
    (same architecture or weights, plus a fresh one-output head) when that is null.
    """

    default_role = "critic"
    counter_names = ("update_calls",)

    def __init__(self, recipe: Mapping[str, Any], role: str = "critic") -> None:
        super().__init__(recipe, role)
        self.config = self.spec.settings
        self.model_cfg = self.spec.model
        self.optim_cfg = self.spec.optim
        self.rollout = self.recipe.rollout.settings
        self.update_calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_device
    def init_model(self) -> None:
        """Build tokenizer, value model (placed by ``roles.critic.strategy``), optimizer and LR scheduler."""
        self._init_trained_model()

    def _build_model(self, model_cfg: Mapping[str, Any]) -> nn.Module:
        return self._load_trained(load_token_value_model, model_cfg)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def compute_values(self, data: DataProto) -> DataProto:
        """Per-token values of the responses, zero past the response mask: ``values`` (B, R)."""
        self._require_model()
        self._require_keys(data, ("input_ids", "attention_mask", "responses"), "compute_values")
        self.module.eval()
        keys = [key for key in ("input_ids", "attention_mask", "position_ids", "responses") if key in data.batch]
        parts = []
        padding_free = self.padding_free(self.module)
        with scoring(self.module, self.engine), torch.no_grad():
            balance = forwards_are_collective(self.module)
            for rows, keep in scoring_slices(len(data), self.config["micro_batch_size"], balance=balance, device=self.device):
                micro = {key: data.batch[key][rows].to(self.device) for key in keys}
                values = response_values(self.module, micro, padding_free)
                if keep:  # not a repeat that only keeps this rank's forward count equal to the others'
                    parts.append(values.cpu())
        values = torch.cat(parts)
        if "response_mask" in data.batch:
            values = values * data.batch["response_mask"].to(values.dtype)
        return DataProto.from_dict({"values": values})

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value-loss epochs over mini-batches; returns rank-averaged ``critic/vf_loss``,
        ``critic/vf_clipfrac``, ``critic/vpred_mean``, ``critic/grad_norm``, ``critic/lr``, and the largest
        rank's ``memory/critic/state_gib`` (``max_allocated_gib`` too on CUDA)."""
        lr = self._start_update(data, _UPDATE_KEYS, "update_critic")
        batch = {key: data.batch[key] for key in _UPDATE_KEYS + ("position_ids",) if key in data.batch}
        if "position_ids" not in batch:
            batch["position_ids"] = position_ids_from_mask(batch["attention_mask"])
        padding_free = self.padding_free(self.module)
        observer = StateObserver(self.module, self.optimizer)
        metrics = self._optimize(
            batch, lambda micro: self._value_loss(micro, padding_free), stream="critic-update",
            epochs=max(1, int(self.config["ppo_epochs"] or 1)),
            mini_batch_rows=samples_per_rank(self.config["mini_batch_size"], self.rollout["n"], self.world_size, len(data)),
            micro_batch_rows=self.config["micro_batch_size"], row_tokens=batch["attention_mask"].sum(-1),
            loss_tokens=loss_token_counts(batch["response_mask"], str(self.config["loss_agg_mode"])), after_step=observer,
        )
        named = {f"critic/{key}": value for key, value in metrics.items()}
        named["critic/lr"] = lr
        return {**allreduce_mean(named, self.device), **observer.metrics(self.role, self.device)}

    def _value_loss(
        self, micro: dict[str, torch.Tensor], padding_free: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        predictions = response_values(self.model, micro, padding_free)
        clip = self.config.get("cliprange_value")
        loss, metrics = value_loss(
            predictions,
            micro["values"].to(predictions.dtype),
            micro["returns"].to(predictions.dtype),
            micro["response_mask"],
            float(clip) if clip is not None else None,
            str(self.config["loss_agg_mode"]),
        )
        return loss, {"vf_loss": loss.detach(), **metrics}
