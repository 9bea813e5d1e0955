"""ReferenceWorker: the frozen reference policy that the KL terms compare against."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from rlhfctl.models.loading import load_causal_lm, load_tokenizer
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import Dispatch, register
from rlhfctl.engine.placement import scoring
from rlhfctl.engine.log_probs import response_log_probs
from rlhfctl.engine.offload import on_device
from workers.role import RoleWorker

__all__ = ["ReferenceWorker"]


class ReferenceWorker(RoleWorker):
    """Frozen copy of the initial policy: ``roles.reference.model``, else the actor's model section
    (an inline config is built with ``trainer.seed``, so it starts identical to the actor)."""

    default_role = "reference"

    def __init__(self, recipe: Mapping[str, Any], role: str = "reference") -> None:
        super().__init__(recipe, role)
        self.config = self.spec.settings
        self.model_cfg = self.spec.model
        self.rollout = self.recipe.rollout.settings
        self.model: nn.Module | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_device
    def init_model(self) -> None:
        """Build the tokenizer and the frozen model (eval mode, no gradients)."""
        trust = bool(self.model_cfg["trust_remote_code"])
        self.tokenizer = load_tokenizer(self.model_cfg, trust_remote_code=trust)

        def build(cfg: Mapping[str, Any]) -> nn.Module:
            model = load_causal_lm(cfg, self.tokenizer, dtype=self.engine.storage_dtype, trust_remote_code=trust, seed=self.seed)
            return model.requires_grad_(False)

        # Frozen: weights stored in model.dtype, sharded under roles.reference.strategy fsdp2.
        self.model, _ = self._place_model(build, self.model_cfg, trainable=False)
        self.model.eval()

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of ``responses`` under the reference policy: ``ref_log_prob`` (B, R)."""
        return DataProto.from_dict({"ref_log_prob": self.frozen_log_probs(data, "compute_ref_log_prob")})

    def frozen_log_probs(self, data: DataProto, method: str) -> Any:
        """(B, R) log-probs of the sampled ``responses`` under this frozen model, at the rollout's temperature."""
        self._require_model()
        self._require_keys(data, ("input_ids", "attention_mask", "responses"), method)
        temperature = data.meta_info.get("temperature", self.rollout["temperature"])
        with scoring(self.model, self.engine):
            log_probs, _ = response_log_probs(
                self.model,
                data.batch,
                device=self.device,
                micro_batch_size=self.config.get("micro_batch_size"),
                temperature=float(temperature) if temperature is not None else 1.0,
                with_entropy=False,
                padding_free=self.padding_free(self.model),
            )
        return log_probs
