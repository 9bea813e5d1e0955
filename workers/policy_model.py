"""The policy model's set-up, shared by the roles that train the policy: the actor (PPO family), SFT and DPO.

- :class:`PolicyModelWorker`: ``roles.<role>`` with the actor's defaults, the causal LM (plus a LoRA adapter with
  ``roles.<role>.lora``) placed by the role's strategy, optimizer and LR schedule (``init_model``), and
  checkpoints restored with the model resident (``load_checkpoint``, under offload); the rest (saves, the HF
  export, fingerprints) is :class:`workers.trainable.TrainableRoleWorker`'s.
- :class:`ResponseScoring`: the policy's log-probs of given responses, and ``compute_ref_log_prob``, the
  reference log-probs of a LoRA policy (its adapter switched off): the actor's and DPO's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rlhfctl.engine.log_probs import response_log_probs
from rlhfctl.engine.lora import adapter_disabled, apply_lora, is_lora
from rlhfctl.engine.offload import on_device
from rlhfctl.engine.placement import scoring
from rlhfctl.models.loading import load_causal_lm
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import Dispatch, register
from workers.trainable import TrainableRoleWorker

__all__ = ["PolicyModelWorker", "ResponseScoring"]


class PolicyModelWorker(TrainableRoleWorker):
    """A role that trains the policy: ``init_model`` builds it, ``update_calls`` counts its optimizer calls."""

    default_role = "actor"
    counter_names: tuple[str, ...] = ("update_calls",)

    def __init__(self, recipe: Mapping[str, Any], role: str = "actor") -> None:
        super().__init__(recipe, role)
        self.config = self.spec.settings
        self.model_cfg = self.spec.model
        self.optim_cfg = self.spec.optim
        self.update_calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_device
    def init_model(self) -> None:
        """Build tokenizer, model (plus LoRA adapter), placed by ``roles.<role>.strategy`` (FSDP2 shards or a
        DDP replica, float32 master weights computing in ``model.dtype``), optimizer and LR scheduler."""
        self._init_trained_model()

    def _build_model(self, model_cfg: Mapping[str, Any]) -> torch.nn.Module:
        model = self._load_trained(load_causal_lm, model_cfg)
        lora = self.config.get("lora")
        if lora is not None and lora is not False:  # `lora: {}` or `lora: true` means the defaults
            model = apply_lora(model, {} if lora is True else lora, seed=self.seed)
        return model

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_device
    def load_checkpoint(self, directory: str) -> None:
        """Restore ``<directory>/<role>/`` (the model and optimizer on the device for it, under offload)."""
        super().load_checkpoint(directory)
        self._after_load()

    def _after_load(self) -> None:
        """What a subclass must do once a checkpoint is restored (the actor: mark its engine's weights stale)."""


class ResponseScoring:
    """Mixed into a :class:`PolicyModelWorker` that scores responses: ``compute_ref_log_prob`` and the
    micro-batched log-probs under the policy as it is. Reads ``self.rollout`` (the sampling temperature)."""

    rollout: Mapping[str, Any]

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Reference log-probs (``ref_log_prob``) with the LoRA adapter disabled; LoRA actors only."""
        self._require_model()
        if not is_lora(self.module):
            raise RuntimeError(
                f"{self.role}.compute_ref_log_prob works only with a LoRA actor (roles.{self.role}.lora set), "
                "where the base weights are the reference; otherwise run a ReferenceWorker (roles.reference)"
            )
        self._require_keys(data, ("input_ids", "attention_mask", "responses"), "compute_ref_log_prob")
        self.module.eval()
        with scoring(self.module, self.engine), adapter_disabled(self.module):
            log_probs, _ = self._response_log_probs(data, with_entropy=False)
        return DataProto.from_dict({"ref_log_prob": log_probs})

    def _response_log_probs(self, data: DataProto, *, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of ``data``'s responses under the module as it is, micro-batched."""
        return response_log_probs(
            self.module,
            data.batch,
            device=self.device,
            micro_batch_size=self.config["micro_batch_size"],
            temperature=self._temperature(data),
            with_entropy=with_entropy,
            padding_free=self.padding_free(self.module),
        )

    def _temperature(self, data: DataProto) -> float:
        value = data.meta_info.get("temperature", self.rollout["temperature"])
        return float(value) if value is not None else 1.0
