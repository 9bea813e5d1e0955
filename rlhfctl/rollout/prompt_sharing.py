"""Score the responses of a batch with one prompt pass per distinct prompt, not one per row.

A GRPO / RLOO batch holds ``n`` responses to each prompt, every row laid out as
``[left-padded prompt | response]``. Under causal attention a prompt's keys and values do not depend
on what follows it, so the prompt part runs once per distinct prompt, and every row continues from its
prompt's keys and values (indexed out of that one pass). Gradients flow back through the shared keys and
values and add up over the rows that used them, so log-probs and gradients equal the row-by-row pass up
to float rounding (tested). The pass saves ``(rows - distinct prompts) x prompt width`` token positions
of forward and backward work: with 8 prompts x 4 samples, 16 prompt and 32 response tokens, a quarter
of them; with 128-token prompts, about 60%.

Two calls instead of one cost a fixed overhead, which a toy model (hidden 64) does not earn back, so the
shared pass runs only when ``saved positions x hidden_size^2`` reaches :data:`MIN_SAVED_WORK`. Its response pass
runs every row at the batch's full response width, so beside a padding-free plain pass (the real tokens only) it
runs only when it has fewer positions than that: a batch of short responses in a wide ``max_new_tokens`` goes packed. It also
needs a model whose cache layers are plain full attention (``rlhfctl.rollout.kv_cache.full_attention_cache``),
the ``sdpa`` or ``eager`` attention kernel (the ones it is tested with), and no gradient checkpointing
while training (transformers turns the cache off there).
``RLHFCTL_SHARED_PROMPT_PASS=0`` turns it off, ``=1`` uses it whenever the model allows.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlhfctl.engine.placement import forwards_are_collective, is_sharded
from rlhfctl.engine.forward import base_model, cache_from, lm_forward
from rlhfctl.rollout.kv_cache import full_attention_cache
from rlhfctl.engine.training import unwrap

__all__ = [
    "MIN_SAVED_WORK",
    "SHARED_PROMPT_ENV",
    "distinct_prompt_rows",
    "shared_prompt_logits",
    "shared_prompt_scores",
]

SHARED_PROMPT_ENV = "RLHFCTL_SHARED_PROMPT_PASS"
# Saved prompt positions x hidden_size^2 below which two calls cost more than one. Measured on 2 CPU
# cores (benchmarks: docs/performance.md): hidden 64 with 384 saved positions (1.6e6) was 20% slower
# shared, hidden 64 with 1152 (4.7e6) 1.3x faster, hidden 256 with 96 (6.3e6) even.
MIN_SAVED_WORK = 2**22
# Attention kernels the shared pass is tested with; others (flash-attention, flex) keep the plain pass.
TESTED_KERNELS = ("sdpa", "eager")


def distinct_prompt_rows(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, inverse)``: one row index per distinct (ids, mask) prompt, and each row's prompt number."""
    keys = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    distinct, inverse = torch.unique(keys, dim=0, return_inverse=True)
    rows = torch.arange(keys.shape[0], device=keys.device)
    first = torch.full((distinct.shape[0],), keys.shape[0], dtype=torch.long, device=keys.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    return first, inverse


def _mode() -> str:
    value = os.environ.get(SHARED_PROMPT_ENV, "auto").strip().lower()
    return {"0": "off", "false": "off", "off": "off", "1": "on", "true": "on", "on": "on"}.get(value, "auto")


def _checkpointing(model: nn.Module) -> bool:
    # transformers 5 renamed is_gradient_checkpointing (now deprecated) to is_activation_checkpointing.
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name):
            return bool(getattr(model, name))
    return False


@dataclass(frozen=True)
class _SharedPlan:
    """The rows that run the prompt pass (``first``), each row's prompt (``inverse``), and the cache."""

    first: torch.Tensor
    inverse: torch.Tensor
    prompt_width: int
    cache: Any


def _shared_plan(model: nn.Module, batch: Mapping[str, torch.Tensor], padding_free: bool = False) -> _SharedPlan | None:
    """Whether the shared pass applies and pays for ``batch``, and its rows; None for the plain pass. With
    ``padding_free`` the plain pass runs the real tokens only, so the shared pass (its responses padded to the batch's
    width) must run fewer positions than those to pay."""
    mode = _mode()
    if mode == "off":
        return None
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    rows, width = input_ids.shape
    prompt_width = width - batch["responses"].shape[1]
    if rows < 2 or prompt_width < 1:
        return None
    inner = base_model(model)
    if inner.training and _checkpointing(inner):
        return None
    if forwards_are_collective(model) or (torch.is_grad_enabled() and is_sharded(inner)):
        return None  # FSDP2 gathers weights per forward (training, scoring): every rank must run the same passes
    first, inverse = distinct_prompt_rows(input_ids[:, :prompt_width], attention_mask[:, :prompt_width])
    saved = (rows - first.shape[0]) * prompt_width
    if saved == 0:
        return None
    if padding_free and first.shape[0] * prompt_width + rows * (width - prompt_width) >= int(attention_mask.sum()):
        return None  # short responses in a wide batch: the packed pass runs fewer positions
    hidden = getattr(getattr(inner, "config", None), "hidden_size", None)
    if mode == "auto" and isinstance(hidden, int) and saved * hidden * hidden < MIN_SAVED_WORK:
        return None
    if getattr(inner.config, "_attn_implementation", None) not in TESTED_KERNELS:
        return None
    cache = full_attention_cache(inner)
    if cache is None:
        return None
    return _SharedPlan(first, inverse, prompt_width, cache)


def _shared_passes(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    position_ids: torch.Tensor,
    plan: _SharedPlan,
    prompt_context: contextlib.AbstractContextManager,
    response_context: contextlib.AbstractContextManager,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``.logits`` of the prompt pass (last position) and of the response pass, each run in its context."""
    input_ids, attention_mask, width = batch["input_ids"], batch["attention_mask"], plan.prompt_width
    first = plan.first
    # The prompt pass skips the DDP wrapper: DDP prepares its gradient reduction once per forward, and the
    # response pass below, whose backward reaches every parameter, is the one it must see.
    with prompt_context:
        prompt_out = lm_forward(
            unwrap(model),
            input_ids[first, :width],
            attention_mask[first, :width],
            position_ids[first, :width],
            cache=plan.cache,
            use_cache=True,
            logits_to_keep=1,
        )
    cache = cache_from(prompt_out)
    cache.batch_select_indices(plan.inverse)  # each row continues from its prompt's keys and values
    with response_context:
        response_out = lm_forward(
            model, input_ids[:, width:], attention_mask, position_ids[:, width:], cache=cache, use_cache=True
        )
    return prompt_out.logits, response_out.logits


def shared_prompt_logits(
    model: nn.Module, batch: Mapping[str, torch.Tensor], position_ids: torch.Tensor, padding_free: bool = False
) -> torch.Tensor | None:
    """Logits (rows, R, vocab) predicting each of the R response tokens, from one pass per distinct
    prompt; None when the shared pass does not apply or would not pay against the plain pass, packed with
    ``padding_free`` (the caller runs the plain pass)."""
    plan = _shared_plan(model, batch, padding_free)
    if plan is None:
        return None
    prompt_logits, response_logits = _shared_passes(
        model, batch, position_ids, plan, contextlib.nullcontext(), contextlib.nullcontext()
    )
    first_token_logits = prompt_logits[:, -1][plan.inverse].unsqueeze(1)
    return torch.cat([first_token_logits, response_logits[:, :-1]], dim=1)


def shared_prompt_scores(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    position_ids: torch.Tensor,
    scoring: Callable[[Callable[[torch.Tensor], torch.Tensor], torch.Tensor], contextlib.AbstractContextManager],
    padding_free: bool = False,
) -> torch.Tensor | None:
    """Scores (rows, R, 2) of the response tokens from the shared pass, the output layer run under
    ``scoring(select, targets)`` (``rlhfctl.engine.forward.scoring_head``); None where the shared pass does not apply
    or would not pay (``padding_free``: against the packed pass)."""
    plan = _shared_plan(model, batch, padding_free)
    if plan is None:
        return None
    responses = batch["responses"]
    rows, response_length = responses.shape

    def first_token(hidden: torch.Tensor) -> torch.Tensor:
        return hidden[:, -1][plan.inverse]

    def later_tokens(hidden: torch.Tensor) -> torch.Tensor:
        return hidden[:, :-1].reshape(-1, hidden.shape[-1])

    first_scores, later_scores = _shared_passes(
        model, batch, position_ids, plan,
        scoring(first_token, responses[:, 0]),
        scoring(later_tokens, responses[:, 1:].reshape(-1)),
    )
    return torch.cat([first_scores.view(rows, 1, 2), later_scores.view(rows, response_length - 1, 2)], dim=1)
