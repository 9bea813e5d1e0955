"""The sampling loop: KV-cached decoding with temperature / top-k / top-p, and the rollout DataProto.

Each prompt row is repeated ``n`` times (its samples consecutive), decoded until every sequence has
produced an EOS token or ``max_new_tokens`` is reached, and the responses are right-padded with the
pad id to exactly ``max_new_tokens`` columns so every rank returns the same width.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from rlhfctl.algorithms import token_log_probs
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import rank_progress
from rlhfctl.rollout.decode_mask import decode_attention_mask
from rlhfctl.rollout.fast_decode import fast_decoder
from rlhfctl.engine.forward import base_model, cache_from, lm_forward
from rlhfctl.rollout.kv_cache import preallocated_cache
from rlhfctl.engine.log_probs import position_ids_from_mask

__all__ = ["SamplingParams", "eos_token_ids", "filter_logits", "generate_batch", "rollout_batch", "sample_responses"]

_OVERRIDABLE = ("n", "do_sample", "temperature", "max_new_tokens", "top_p", "top_k")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one rollout (``rollout`` section, optionally overridden by a batch's meta_info)."""

    n: int = 4
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    do_sample: bool = True

    @classmethod
    def from_config(cls, rollout: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> "SamplingParams":
        """Build from a ``rollout`` mapping, then apply any of n/do_sample/temperature/max_new_tokens/top_p/top_k."""
        params = cls(
            n=int(rollout["n"]),
            max_new_tokens=int(rollout["max_new_tokens"]),
            temperature=float(rollout["temperature"]),
            top_p=float(rollout["top_p"]),
            top_k=int(rollout["top_k"] or 0),
            do_sample=bool(rollout["do_sample"]),
        )
        changes = {key: (overrides or {})[key] for key in _OVERRIDABLE if (overrides or {}).get(key) is not None}
        params = replace(params, **changes)
        params = replace(
            params,
            n=int(params.n),
            max_new_tokens=int(params.max_new_tokens),
            temperature=float(params.temperature),
            top_p=float(params.top_p),
            top_k=int(params.top_k),
            do_sample=bool(params.do_sample),
        )
        if params.n < 1:
            raise ValueError(f"rollout.n must be >= 1, got {params.n}")
        if params.max_new_tokens < 1:
            raise ValueError(f"rollout.max_new_tokens must be >= 1, got {params.max_new_tokens}")
        if not 0.0 < params.top_p <= 1.0:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {params.top_p}")
        return params

    @property
    def greedy(self) -> bool:
        """True when decoding takes the arg-max token."""
        return not self.do_sample or self.temperature <= 0.0


def eos_token_ids(tokenizer: Any, model: nn.Module | None = None) -> list[int]:
    """The tokenizer's EOS id plus any the model's generation config lists."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    generation_config = getattr(model, "generation_config", None)
    extra = getattr(generation_config, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, Iterable):
        ids.update(int(i) for i in extra)
    if not ids:
        raise ValueError("the tokenizer defines no EOS token; generation could never stop early")
    return sorted(ids)


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Scale by 1/temperature, keep the ``top_k`` largest (0 = all) and the smallest set of tokens
    whose probability mass reaches ``top_p``; removed tokens get ``-inf``."""
    logits = logits / max(temperature, 1e-6)
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        remove = mass_before >= top_p
        remove[..., 0] = False
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def _next_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    logits = logits.float()
    if params.greedy:
        return logits.argmax(dim=-1)
    filtered = filter_logits(logits, params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(filtered, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def sample_responses(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    params: SamplingParams,
    *,
    eos_ids: list[int],
    pad_id: int,
    generator: torch.Generator | None = None,
    samples_per_prompt: int = 1,
    with_log_probs: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Decode ``samples_per_prompt`` continuations of each left-padded prompt (consecutive rows);
    returns ``responses`` (B * samples_per_prompt, max_new_tokens) padded with ``pad_id`` after the
    first EOS, and ``response_mask`` (1 up to and including that EOS); with ``with_log_probs`` also each
    sampled token's log-prob under ``softmax(logits / T)`` (the distribution the actor scores; 0 on padding)."""
    device = input_ids.device
    # inference_mode skips autograd's per-op bookkeeping (a sizeable share of a small model's decode step);
    # the returned tensors are built outside it, so they are ordinary tensors that autograd may save later.
    with torch.inference_mode():
        eos = torch.tensor(eos_ids, device=device)
        repeats = int(samples_per_prompt)
        # The cache has room for the whole rollout up front; None falls back to the model's own cache.
        prompt_width = input_ids.shape[1]
        inner = base_model(model)
        cache = preallocated_cache(inner, prompt_width + params.max_new_tokens)
        cache_is_ours = cache is not None
        if cache is None and repeats > 1:  # the model's own cache cannot fan out: repeat the prompts first
            input_ids, attention_mask = input_ids.repeat_interleave(repeats, 0), attention_mask.repeat_interleave(repeats, 0)
            repeats = 1
        mask = attention_mask.to(device)
        positions = position_ids_from_mask(mask)
        output = lm_forward(model, input_ids, mask, positions, cache=cache, use_cache=True, logits_to_keep=1)
        cache, logits = cache_from(output), output.logits[:, -1, :]
        if repeats > 1:
            # One prompt pass per distinct prompt; each of its samples continues from its own copy of the cache.
            cache.batch_repeat_interleave(repeats)
            logits = logits.repeat_interleave(repeats, 0)
            mask, positions = mask.repeat_interleave(repeats, 0), positions.repeat_interleave(repeats, 0)
        rows = mask.shape[0]
        next_position = positions[:, -1:] + 1
        # With our cache, llama-family models decode in fewer ops (rlhfctl/rollout/fast_decode.py); other models
        # get the decoding steps' 4D mask built once, or else the 2D mask growing per token.
        decoder = step_masks = None
        if cache_is_ours:
            max_position = int(next_position.max()) + params.max_new_tokens
            decoder = fast_decoder(inner, cache, mask, params.max_new_tokens, max_position)
            if decoder is None:
                step_masks = decode_attention_mask(inner, mask, params.max_new_tokens)
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        tokens, valid, scores = [], [], []
        for step in range(params.max_new_tokens):
            chosen = _next_tokens(logits, params, generator)
            chosen = torch.where(finished, torch.full_like(chosen, pad_id), chosen)
            if with_log_probs:
                scores.append(token_log_probs(logits, chosen, temperature=params.temperature, with_entropy=False)[0])
            tokens.append(chosen)
            valid.append(~finished)
            finished = finished | torch.isin(chosen, eos)
            rank_progress.report(step + 1, params.max_new_tokens, "tokens")  # throttled: a clock read per token
            if bool(finished.all()) or step == params.max_new_tokens - 1:
                break
            if decoder is not None:
                logits = decoder.step(chosen.unsqueeze(-1), next_position)
            else:
                if step_masks is not None:
                    step_mask = step_masks[..., : prompt_width + step + 1]
                else:
                    mask = step_mask = torch.cat([mask, torch.ones(rows, 1, dtype=mask.dtype, device=device)], dim=1)
                output = lm_forward(
                    model, chosen.unsqueeze(-1), step_mask, next_position, cache=cache, use_cache=True, logits_to_keep=1
                )
                cache, logits = cache_from(output), output.logits[:, -1, :]
            next_position = next_position + 1
    responses = torch.full((rows, params.max_new_tokens), pad_id, dtype=input_ids.dtype, device=device)
    response_mask = torch.zeros((rows, params.max_new_tokens), dtype=attention_mask.dtype, device=device)
    responses[:, : len(tokens)] = torch.stack(tokens, dim=1)
    response_mask[:, : len(valid)] = torch.stack(valid, dim=1).to(attention_mask.dtype)
    if not with_log_probs:
        return responses, response_mask
    log_probs = torch.zeros((rows, params.max_new_tokens), dtype=torch.float32, device=device)
    log_probs[:, : len(scores)] = torch.stack(scores, dim=1).float() * response_mask[:, : len(scores)]
    return responses, response_mask, log_probs


def _repeat_columns(prompts: DataProto, n: int) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    expanded = prompts.repeat(n, interleave=True) if n > 1 else prompts
    return dict(expanded.batch), dict(expanded.non_tensor_batch)


def generate_batch(
    model: nn.Module,
    tokenizer: Any,
    prompts: DataProto,
    params: SamplingParams,
    *,
    device: torch.device,
    generator: torch.Generator | None = None,
) -> DataProto:
    """Sample ``params.n`` responses per prompt row and build the rollout DataProto (see docs/workers.md)."""
    for key in ("input_ids", "attention_mask"):
        if key not in prompts.batch:
            raise KeyError(f"generate_sequences needs tensor '{key}' (left-padded prompts); got {prompts.keys()}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_ids(tokenizer, model)[0]
    responses, response_mask = sample_responses(
        model,
        prompts.batch["input_ids"].to(device),
        prompts.batch["attention_mask"].to(device),
        params,
        eos_ids=eos_token_ids(tokenizer, model),
        pad_id=int(pad_id),
        generator=generator,
        samples_per_prompt=params.n,
    )
    return rollout_batch(prompts, responses.cpu(), response_mask.cpu(), tokenizer, params)


def rollout_batch(
    prompts: DataProto,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    tokenizer: Any,
    params: SamplingParams,
    extra: Mapping[str, torch.Tensor] | None = None,
    response_attention_mask: torch.Tensor | None = None,
) -> DataProto:
    """The rollout DataProto every engine returns: prompts repeated ``n`` times (samples consecutive),
    responses right-padded, masks and position ids over prompt + response, ``response_text``;
    ``extra`` adds per-sample tensors (the vllm engine's ``rollout_log_probs``).

    ``response_attention_mask`` marks the response's real tokens where they are more than the loss mask
    (agent rollouts: tool outputs are real tokens, attended to, with ``response_mask`` 0); it defaults to
    ``response_mask``. The attention mask, not the loss mask, gives a response's length and last token."""
    tensors, non_tensors = _repeat_columns(prompts, params.n)
    prompt_ids = tensors.pop("input_ids")
    prompt_mask = tensors.pop("attention_mask")
    tensors.pop("position_ids", None)
    real = response_mask if response_attention_mask is None else response_attention_mask
    attention_mask = torch.cat([prompt_mask, real.to(prompt_mask.dtype)], dim=1)
    lengths = real.sum(dim=-1).tolist()
    texts = [
        tokenizer.decode(row[:length].tolist(), skip_special_tokens=True) for row, length in zip(responses, lengths)
    ]
    tensors.update(
        {
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask),
            **dict(extra or {}),
        }
    )
    response_text = np.empty(len(texts), dtype=object)
    response_text[:] = texts
    non_tensors["response_text"] = response_text
    # The sampling temperature travels on, so later log-prob passes score the same distribution.
    meta_info = {**prompts.meta_info, "temperature": params.temperature}
    return DataProto(batch=tensors, non_tensor_batch=non_tensors, meta_info=meta_info)
