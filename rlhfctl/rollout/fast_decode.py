"""One decoding step of a llama-family decoder in fewer tensor ops than transformers' forward.

Sampling runs the model once per new token on a single position per row, where a forward call costs
far more in per-op overhead than in arithmetic: transformers' qwen2 step is about 45 ops per layer
(RMSNorm alone is 7, the rotary embedding is recomputed for every call, and q and k are rotated
apart), plus argument checks, output dataclasses and the cache bookkeeping. On 2 CPU cores that
overhead was a fifth of a decoding step at hidden 256 x 4 layers and half of it at hidden 64 x 2.

:class:`FastDecoder` runs the same computation from the model's own modules and weights: the fused
``torch.nn.functional.rms_norm``, a cos/sin table built once per rollout by the model's own rotary
embedding, q and k rotated together, ``scaled_dot_product_attention`` on the preallocated cache
(:mod:`rlhfctl.rollout.kv_cache`), and the mask built once (:mod:`rlhfctl.rollout.decode_mask`). The prompt pass
still runs through transformers, so both fill the same cache. Logits equal the transformers step up to
float rounding (tested), so sampled tokens can differ only in rare near-ties.

Only where that equality is known to hold (:func:`fast_decoder`): the llama, mistral and qwen2
families, the ``sdpa`` and ``eager`` kernels, rotary embeddings that depend on the position alone,
no sliding window shorter than the rollout, and plain ``nn.Linear`` / ``nn.Embedding`` modules (LoRA
adapters and quantized layers keep the transformers step). ``RLHFCTL_FAST_DECODE=0`` turns it off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlhfctl.rollout import kv_cache

__all__ = ["FAST_DECODE_ENV", "FAST_DECODE_MODEL_TYPES", "FastDecoder", "fast_decoder"]

FAST_DECODE_ENV = "RLHFCTL_FAST_DECODE"
# Families whose decoder layer is exactly: x + attn(rms_norm(x)), then x + mlp(rms_norm(x)), with
# rotary q/k and an act(gate) * up MLP; qwen3 (q/k norms), gemma (scaled embeddings, extra norms)
# and others differ.
FAST_DECODE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2"})
# Rotary types whose cos/sin depend on the position alone ("dynamic" and "longrope" also depend on
# the longest sequence seen, which a table built up front would anticipate).
_POSITIONAL_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})
_KERNELS = ("sdpa", "eager")
# F.rms_norm arrived in torch 2.4 and scaled_dot_product_attention's enable_gqa in 2.5.
_TORCH_HAS_OPS = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


@dataclass
class _Layer:
    """One decoder layer's modules, and the cache layer it reads and fills."""

    input_norm: nn.Module
    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear
    post_norm: nn.Module
    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear
    act_fn: Any
    cache: Any


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    # As transformers' LlamaRMSNorm: normalize in float32, cast back, then scale by the weight.
    normalized = F.rms_norm(x.float(), (x.shape[-1],), None, norm.variance_epsilon)
    return norm.weight * normalized.to(x.dtype)


class FastDecoder:
    """Decodes one token per row per :meth:`step`, continuing the prompt pass's preallocated cache."""

    def __init__(self, model: nn.Module, layers: list[_Layer], rotary: tuple[torch.Tensor, torch.Tensor],
                 prompt_mask: torch.Tensor, max_new_tokens: int) -> None:
        inner = model.model
        config = model.config
        self.embed = inner.embed_tokens
        self.final_norm = inner.norm
        self.lm_head = model.lm_head
        self.layers = layers
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.cos, self.sin = rotary
        self.head_dim = int(self.cos.shape[-1])
        self.scaling = float(getattr(inner.layers[0].self_attn, "scaling", None) or self.head_dim**-0.5)
        rows = prompt_mask.shape[0]
        generated = torch.ones(rows, max_new_tokens, dtype=torch.bool, device=prompt_mask.device)
        self.mask = torch.cat([prompt_mask.bool(), generated], dim=1)[:, None, None, :]

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits (rows, vocab) of the next token after ``tokens`` (rows, 1) at ``positions`` (rows, 1)."""
        rows = tokens.shape[0]
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        cos = self.cos[positions.view(-1)].view(rows, 1, 1, head_dim)
        sin = self.sin[positions.view(-1)].view(rows, 1, 1, head_dim)
        half = head_dim // 2
        hidden = F.embedding(tokens, self.embed.weight)
        for layer in self.layers:
            normed = _rms_norm(hidden, layer.input_norm)
            q = F.linear(normed, layer.q_proj.weight, layer.q_proj.bias).view(rows, 1, heads, head_dim)
            k = F.linear(normed, layer.k_proj.weight, layer.k_proj.bias).view(rows, 1, kv_heads, head_dim)
            v = F.linear(normed, layer.v_proj.weight, layer.v_proj.bias).view(rows, 1, kv_heads, head_dim)
            # q and k rotated in one pass: (rows, heads + kv_heads, 1, head_dim).
            qk = torch.cat([q, k], dim=2).transpose(1, 2)
            rotated = qk * cos + torch.cat([-qk[..., half:], qk[..., :half]], dim=-1) * sin
            keys, values = layer.cache.update(rotated[:, heads:], v.transpose(1, 2))
            attended = F.scaled_dot_product_attention(rotated[:, :heads], keys, values,
                                                      attn_mask=self.mask[..., : keys.shape[-2]],
                                                      scale=self.scaling, enable_gqa=kv_heads != heads)
            hidden = hidden + F.linear(attended.transpose(1, 2).reshape(rows, 1, heads * head_dim),
                                       layer.o_proj.weight, layer.o_proj.bias)
            normed = _rms_norm(hidden, layer.post_norm)
            gate = layer.act_fn(F.linear(normed, layer.gate_proj.weight, layer.gate_proj.bias))
            up = F.linear(normed, layer.up_proj.weight, layer.up_proj.bias)
            hidden = hidden + F.linear(gate * up, layer.down_proj.weight, layer.down_proj.bias)
        hidden = _rms_norm(hidden[:, -1], self.final_norm)
        return F.linear(hidden, self.lm_head.weight, self.lm_head.bias)


def _enabled() -> bool:
    return os.environ.get(FAST_DECODE_ENV, "1").strip().lower() not in ("0", "false", "off")


def _is(module: Any, cls: type) -> bool:
    return type(module) is cls


def _is_rms_norm(module: Any) -> bool:
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "weight") and hasattr(module, "variance_epsilon")


def _window_fits(attention: nn.Module, config: Any, capacity: int) -> bool:
    # qwen2 keeps the window on each attention module (None on full-attention layers); mistral on the config.
    window = attention.sliding_window if hasattr(attention, "sliding_window") else getattr(config, "sliding_window", None)
    return window is None or int(window) >= capacity


def _rotary_table(model: nn.Module, max_position: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """cos and sin (positions, head_dim) from the model's own rotary embedding, for positions 0..max_position."""
    weight = model.model.embed_tokens.weight
    positions = torch.arange(max_position + 1, device=weight.device)[None, :]
    try:
        cos, sin = model.model.rotary_emb(weight, positions)
    except TypeError:  # a transformers whose rotary embedding takes other arguments: keep its own step
        return None
    if cos.shape != (1, max_position + 1, head_dim):
        return None
    return cos[0], sin[0]


def fast_decoder(model: nn.Module, cache: Any, prompt_mask: torch.Tensor, max_new_tokens: int,
                 max_position: int) -> FastDecoder | None:
    """A :class:`FastDecoder` over ``cache`` (a :func:`rlhfctl.rollout.kv_cache.preallocated_cache` the prompt
    pass filled), or None where the model is not one it reproduces exactly; callers then keep the
    model's forward. ``model`` is the innermost transformers causal LM (``rlhfctl.engine.forward.base_model``);
    ``max_position`` the largest position id a decoded token can get."""
    if not (_enabled() and _TORCH_HAS_OPS):
        return None
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if config is None or inner is None or getattr(config, "model_type", None) not in FAST_DECODE_MODEL_TYPES:
        return None
    if getattr(config, "_attn_implementation", None) not in _KERNELS or int(getattr(config, "pretraining_tp", 1) or 1) != 1:
        return None
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", None) not in _POSITIONAL_ROPE_TYPES:
        return None
    if not (_is(getattr(inner, "embed_tokens", None), nn.Embedding) and _is(getattr(model, "lm_head", None), nn.Linear)
            and _is_rms_norm(getattr(inner, "norm", None))):
        return None
    cache_layers = getattr(cache, "layers", None)
    decoder_layers = list(getattr(inner, "layers", []))
    if not decoder_layers or cache_layers is None or len(cache_layers) != len(decoder_layers):
        return None
    capacity = prompt_mask.shape[1] + max_new_tokens
    layers = []
    for decoder_layer, cache_layer in zip(decoder_layers, cache_layers):
        attention, mlp = getattr(decoder_layer, "self_attn", None), getattr(decoder_layer, "mlp", None)
        projections = [getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        mlp_parts = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
        norms = [getattr(decoder_layer, name, None) for name in ("input_layernorm", "post_attention_layernorm")]
        if not (all(_is(p, nn.Linear) for p in projections + mlp_parts) and all(_is_rms_norm(n) for n in norms)
                and callable(getattr(mlp, "act_fn", None)) and _window_fits(attention, config, capacity)
                and isinstance(cache_layer, getattr(kv_cache, "PreallocatedLayer", ()))):
            return None
        layers.append(_Layer(norms[0], *projections, norms[1], *mlp_parts, mlp.act_fn, cache_layer))
    attention = decoder_layers[0].self_attn
    head_dim = int(getattr(attention, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    rotary_table = _rotary_table(model, max_position, head_dim)
    if rotary_table is None:
        return None
    return FastDecoder(model, layers, rotary_table, prompt_mask, max_new_tokens)
