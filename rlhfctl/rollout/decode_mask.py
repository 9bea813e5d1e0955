"""Attention masks for the decoding steps, built once per rollout instead of once per token.

Given a 2D padding mask, transformers rebuilds the 4D attention mask inside every forward call
(``create_causal_mask``): about a dozen small tensor ops and checks per call. That is 15-20% of
sampling a small model on CPU, one new token at a time. While decoding with the preallocated cache the
mask is known up front: a new token may attend to every non-padding prompt position and to every
generated position before it, which for a single query token is just the padding mask over the keys. So
it is built once, as the 4D tensor transformers would have built, and each step passes a view of its
first ``keys`` columns, which transformers uses as is.

Only where that is known to be exact: the ``sdpa`` and ``eager`` attention kernels (a boolean mask and
an additive one, the formats transformers itself produces for them) and decoder families whose forward
uses the 2D mask for nothing but building that 4D mask. Any other model gets ``None`` and keeps the
per-step 2D mask.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DECODE_MASK_MODEL_TYPES", "decode_attention_mask"]

# Decoder-only families whose forward turns the 2D mask into a causal mask and uses it for nothing
# else (families such as bloom or falcon also derive ALiBi biases from it, so they are left out).
DECODE_MASK_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "olmo", "olmo2", "granite"}
)


def decode_attention_mask(model: nn.Module, prompt_mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor | None:
    """The 4D mask (rows, 1, 1, prompt + max_new_tokens) for single-token decoding steps, or None.

    Decoding step ``s`` (0-based, after the prompt pass) passes ``mask[..., : prompt + s + 1]``.
    ``model`` is the innermost transformers model (see ``rlhfctl.engine.forward.base_model``).
    """
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in DECODE_MASK_MODEL_TYPES:
        return None
    kernel = getattr(config, "_attn_implementation", None)
    if kernel not in ("sdpa", "eager"):
        return None
    rows = prompt_mask.shape[0]
    generated = torch.ones(rows, max_new_tokens, dtype=torch.bool, device=prompt_mask.device)
    allowed = torch.cat([prompt_mask.bool(), generated], dim=1)[:, None, None, :]
    if kernel == "sdpa":
        return allowed  # True = may attend, as transformers' sdpa_mask
    dtype = next(model.parameters()).dtype
    additive = torch.zeros(allowed.shape, dtype=dtype, device=prompt_mask.device)
    return additive.masked_fill(~allowed, torch.finfo(dtype).min)  # as transformers' eager_mask
