"""The hf engine's own precision: a plain copy of the actor's model in ``rollout.dtype`` that the colocated hf
engine samples from, refreshed from the actor's weights after each update.

Why a copy, not autocast: autocast only lowers a matmul's precision (a float32 actor sampling in bf16), cannot raise
it (a bf16 actor sampling in float32), and inside the actor it competes with the replicated path's own autocast hooks
(``rlhfctl.engine.placement``). A copy holds the weights rounded once to ``rollout.dtype``, as a vLLM engine and the
rollout group of ``rollout.placement: separate`` hold them, so the three engines sample alike; its KV cache follows
its dtype. The price is one more model in ``rollout.dtype`` on each actor rank (the memory plan counts it) and a copy
of the weights before the first rollout after each update: the same gather, cast and copy a rollout group's sync
makes (:func:`rlhfctl.rollout.vllm_engine.gathered_weights`, a bucket at a time; a collective under FSDP2, made by
every rank, since every rank generates).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from rlhfctl.models.loading import load_causal_lm
from rlhfctl.rollout import vllm_engine

__all__ = ["PrecisionReplica", "copy_weights"]


def copy_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], who: str) -> None:
    """Copy each (checkpoint name, tensor) into ``model``'s parameter of that name, cast to its dtype; every parameter
    must arrive (``who`` names the receiver in the errors)."""
    parameters = dict(model.named_parameters())
    missing = set(parameters)
    with torch.no_grad():
        for name, tensor in weights:
            target = parameters.get(name)
            if target is None:
                raise KeyError(f"{who}: the actor sent weight '{name}', which the rollout model lacks")
            target.copy_(tensor)
            missing.discard(name)
    if missing:
        raise KeyError(f"{who}: the weight sync missed {sorted(missing)[:5]}")


class PrecisionReplica:
    """A frozen copy of the actor's model in ``dtype`` on ``device``; :meth:`refresh` copies the actor's current
    weights into it when :attr:`current` is False (at first, and after each update or checkpoint load)."""

    def __init__(self, model_cfg: Mapping[str, Any], tokenizer: Any, *, dtype: torch.dtype, device: torch.device,
                 seed: int, rollout: Mapping[str, Any], who: str) -> None:
        trust = bool(model_cfg["trust_remote_code"])
        model = load_causal_lm(model_cfg, tokenizer, dtype=dtype, trust_remote_code=trust, seed=seed)
        self.model: nn.Module = model.requires_grad_(False).to(device).eval()
        self.dtype, self.who = dtype, who
        self.bucket_bytes = int(float(vllm_engine.engine_settings(rollout)["sync_bucket_mib"]) * 2**20)
        self.current = False

    def refresh(self, module: nn.Module) -> None:
        """Copy ``module``'s weights (plain, DDP, FSDP2 or peft: LoRA merged) in ``dtype``, unless already current."""
        if self.current:
            return
        copy_weights(self.model, vllm_engine.gathered_weights(module, self.bucket_bytes, self.dtype), self.who)
        self.current = True
