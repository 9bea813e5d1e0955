"""Call a causal LM the same way whatever wraps it (DDP, peft) and whichever transformers names its cache.

transformers 5 renamed the forward argument ``past_key_values`` to ``cache`` (and the output field
likewise); older releases, and custom models, use the old names. ``logits_to_keep`` is passed only to
models that accept it.

The log-prob passes read the output layer in token chunks (:func:`scoring_head`): for one call the LM
head returns, instead of ``[tokens, vocab]`` logits, each selected token's log-prob and entropy, computed a
chunk of tokens at a time, so the peak holds one chunk's logits. It runs inside the model's own forward,
so DDP, peft and FSDP2 (whose root unit holds the head) see an ordinary call.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from rlhfctl.algorithms import token_log_probs

__all__ = [
    "SCORED_HEAD_FAMILIES",
    "base_model",
    "cache_from",
    "chunked_token_log_probs",
    "lm_forward",
    "output_layer",
    "scoring_head",
]

#: Families whose causal-LM forward returns ``lm_head(hidden_states)`` as its logits, with no scaling or
#: softcapping after it, so the head may score tokens in its place. Others keep the full-logits pass.
SCORED_HEAD_FAMILIES = frozenset({"qwen2", "qwen3", "llama", "mistral"})


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


def output_layer(model: nn.Module) -> nn.Module | None:
    """The LM head of ``model`` (under DDP / peft) where it may score tokens in chunks, else None."""
    inner = base_model(model)
    if getattr(getattr(inner, "config", None), "model_type", None) not in SCORED_HEAD_FAMILIES:
        return None
    get = getattr(inner, "get_output_embeddings", None)
    try:
        head = get() if callable(get) else None
    except NotImplementedError:
        head = None
    return head if isinstance(head, nn.Module) else None


def chunked_token_log_probs(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    chunk_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (N,) of ``targets`` and entropies from head inputs ``hidden`` (N, H), ``chunk_tokens`` at a time.

    Only one chunk's logits exist at once. With gradients on, each chunk runs under activation
    checkpointing: the forward keeps no logits, and the backward recomputes one chunk's at a time.
    """

    def score(rows: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return token_log_probs(
            head(rows), labels, temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad
        )

    step = max(1, int(chunk_tokens))
    parts = []
    for start in range(0, max(1, hidden.shape[0]), step):
        rows, labels = hidden[start : start + step], targets[start : start + step]
        if torch.is_grad_enabled():
            parts.append(checkpoint(score, rows, labels, use_reentrant=False))
        else:
            parts.append(score(rows, labels))
    log_probs = torch.cat([part[0] for part in parts])
    entropy = torch.cat([part[1] for part in parts]) if with_entropy else None
    return log_probs, entropy


@contextlib.contextmanager
def scoring_head(
    model: nn.Module,
    select: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    chunk_tokens: int,
) -> Iterator[None]:
    """Within the block, ``model``'s output layer returns scores (N, 2) instead of logits: the log-prob of
    ``targets`` (N,) and the entropy (0 without ``with_entropy``) at the head inputs ``select(hidden)`` (N, H).

    ``model`` must have an :func:`output_layer`. The head is replaced for this block only (its instance
    ``forward``), and called by the model's own forward, so every wrapper's hooks run as usual.
    """
    head = output_layer(model)
    if head is None:
        raise ValueError(f"{type(base_model(model)).__name__} has no output layer that can score tokens in chunks")
    original = head.forward
    own = head.__dict__.get("forward")

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        log_probs, entropy = chunked_token_log_probs(
            original, select(hidden), targets, temperature=temperature, with_entropy=with_entropy,
            entropy_grad=entropy_grad, chunk_tokens=chunk_tokens,
        )
        return torch.stack([log_probs, entropy if entropy is not None else torch.zeros_like(log_probs)], dim=-1)

    head.forward = forward
    try:
        yield
    finally:
        if own is not None:
            head.forward = own
        else:
            del head.forward
