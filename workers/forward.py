"""Call a causal LM the same way whatever wraps it (DDP, peft) and whichever transformers names its cache.

transformers 5 renamed the forward argument ``past_key_values`` to ``cache`` (and the output field
likewise); older releases, and custom models, use the old names. ``logits_to_keep`` is passed only to
models that accept it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import nn

__all__ = ["base_model", "cache_from", "lm_forward"]


def base_model(model: nn.Module) -> nn.Module:
    """The innermost transformers model under DDP and peft wrappers."""
    inner = model
    for _ in range(8):
        if isinstance(inner, nn.parallel.DistributedDataParallel):
            inner = inner.module
        elif hasattr(inner, "get_base_model") and callable(inner.get_base_model):
            inner = inner.get_base_model()
        else:
            break
    return inner


@functools.lru_cache(maxsize=64)
def _forward_parameters(model_type: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_type.forward).parameters)


def _accepts(model: nn.Module) -> frozenset[str]:
    return _forward_parameters(type(base_model(model)))


def lm_forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    cache: Any = None,
    use_cache: bool = False,
    logits_to_keep: int = 0,
) -> Any:
    """Run ``model`` (possibly wrapped) and return its output; logits cover the last ``logits_to_keep``
    positions when the model supports it (0 = all). Callers slice ``logits[:, -k:]`` either way."""
    accepted = _accepts(model)
    kwargs: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "use_cache": use_cache,
    }
    if cache is not None or use_cache:
        cache_name = "cache" if "cache" in accepted else "past_key_values"
        if cache is not None:
            kwargs[cache_name] = cache
    if logits_to_keep and "logits_to_keep" in accepted:
        kwargs["logits_to_keep"] = logits_to_keep
    return model(**kwargs)


def cache_from(output: Any) -> Any:
    """The key/value cache of a forward output, under either field name."""
    for name in ("cache", "past_key_values"):
        value = output.get(name) if hasattr(output, "get") else getattr(output, name, None)
        if value is not None:
            return value
    raise RuntimeError("the model returned no key/value cache; it must support use_cache=True for generation")
