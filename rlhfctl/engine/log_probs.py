"""Log-probabilities (and entropies) of the response tokens from one forward pass over prompt + response.

With ``P`` prompt columns and ``R`` response columns, the token at response position ``t`` is
predicted by the logits at sequence position ``P + t - 1``. Logits are divided by the sampling
temperature (as the rollout sampled from ``softmax(logits / T)``) and reduced in float32. Where rows
repeat a prompt, the prompt part may run once per distinct prompt (``rlhfctl.rollout.prompt_sharing``); with
``padding_free`` the rows run packed into one, without their pad tokens (``rlhfctl.engine.packing``).

The output layer scores the response tokens :data:`LOGITS_CHUNK_TOKENS` at a time
(``rlhfctl.engine.forward.scoring_head``), so the pass holds one chunk's ``[tokens, vocab]`` float32 logits,
not the whole micro-batch's several times over; models without a reachable output layer, and
``chunk_tokens=0``, compute the full logits as before.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
from torch import nn

from rlhfctl.algorithms import token_log_probs
from rlhfctl.engine.placement import forwards_are_collective, scoring_grad_mode
from rlhfctl.engine.forward import lm_forward, output_layer, scoring_head
from rlhfctl.engine.micro_batches import scoring_slices
from rlhfctl.engine.packing import packed_response_log_probs
from rlhfctl.rollout.prompt_sharing import shared_prompt_logits, shared_prompt_scores

__all__ = ["LOGITS_CHUNK_TOKENS", "position_ids_from_mask", "response_log_probs", "sequence_log_probs"]

#: Response tokens whose logits the log-prob and entropy pass holds at once (the memory plan models one
#: chunk's ``[LOGITS_CHUNK_TOKENS, vocab]`` float32 logits). At vocab 152k a chunk is 0.58 GiB.
LOGITS_CHUNK_TOKENS = 1024


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions for left-padded rows: cumulative sum of the mask minus one, clamped at 0."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def sequence_log_probs(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    *,
    temperature: float = 1.0,
    with_entropy: bool = True,
    entropy_grad: bool = True,
    padding_free: bool = False,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (B, R) of ``batch['responses']`` and their entropies (or None); keeps the graph.

    ``batch`` holds ``input_ids``, ``attention_mask``, ``responses`` and optionally ``position_ids``
    (computed from the mask when absent), all on the model's device. With ``entropy_grad=False``
    the entropy is computed from detached logits (a metric only, no graph kept for it). With
    ``padding_free`` the rows run as one packed row; cells where the response token or the one before
    it is padding are then 0 (the padded pass leaves values there that every caller masks out).
    ``chunk_tokens`` (default :data:`LOGITS_CHUNK_TOKENS`) bounds the tokens scored at once; 0 computes
    the whole micro-batch's logits in one piece (the unchunked pass).
    """
    chunk = LOGITS_CHUNK_TOKENS if chunk_tokens is None else int(chunk_tokens)
    if chunk > 0 and output_layer(model) is None:
        chunk = 0  # no reachable output layer: the full logits from the model's forward
    position_ids = batch.get("position_ids")
    if position_ids is None:
        position_ids = position_ids_from_mask(batch["attention_mask"])
    options = {"temperature": temperature, "with_entropy": with_entropy, "entropy_grad": entropy_grad}
    if chunk:
        return _chunked_log_probs(model, batch, position_ids, chunk, padding_free, options)
    # One prompt pass per distinct prompt where the batch repeats prompts (n samples each) and it pays.
    logits = shared_prompt_logits(model, batch, position_ids, padding_free)
    if logits is None and padding_free:
        return packed_response_log_probs(model, batch, position_ids, chunk_tokens=0, **options)
    if logits is None:
        response_length = batch["responses"].shape[1]
        output = lm_forward(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            position_ids,
            use_cache=False,
            logits_to_keep=response_length + 1,
        )
        logits = output.logits[:, -response_length - 1 : -1]
    return token_log_probs(logits, batch["responses"], **options)


def _chunked_log_probs(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    position_ids: torch.Tensor,
    chunk: int,
    padding_free: bool,
    options: dict,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`sequence_log_probs` with the output layer scoring ``chunk`` tokens at a time."""
    responses = batch["responses"]
    rows, response_length = responses.shape
    scoring = functools.partial(scoring_head, model, chunk_tokens=chunk, **options)
    scores = shared_prompt_scores(model, batch, position_ids, scoring, padding_free)
    if scores is None and padding_free:
        return packed_response_log_probs(model, batch, position_ids, chunk_tokens=chunk, **options)
    if scores is None:

        def select(hidden: torch.Tensor) -> torch.Tensor:
            return hidden[:, -response_length - 1 : -1].reshape(-1, hidden.shape[-1])

        with scoring(select, responses.reshape(-1)):
            output = lm_forward(
                model,
                batch["input_ids"],
                batch["attention_mask"],
                position_ids,
                use_cache=False,
                logits_to_keep=response_length + 1,
            )
        scores = output.logits.view(rows, response_length, 2)
    return scores[..., 0], scores[..., 1] if options["with_entropy"] else None


def response_log_probs(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    *,
    device: torch.device,
    micro_batch_size: int | None = None,
    temperature: float = 1.0,
    with_entropy: bool = True,
    padding_free: bool = False,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`sequence_log_probs` without gradients, in micro-batches; results on the CPU. Where forwards
    gather FSDP2 units, every rank runs as many micro-batches (``rlhfctl.engine.micro_batches.scoring_slices``)."""
    rows = batch["responses"].shape[0]
    keys = [key for key in ("input_ids", "attention_mask", "position_ids", "responses") if key in batch]
    log_prob_parts, entropy_parts = [], []
    slices = scoring_slices(rows, micro_batch_size, balance=forwards_are_collective(model), device=device)
    # inference_mode (where FSDP2 does not gather per unit) skips autograd's bookkeeping; the concatenations
    # below run outside it, so the results are ordinary tensors (the local backend hands them to update_actor).
    with scoring_grad_mode(model):
        for rows_slice, keep in slices:
            micro = {key: batch[key][rows_slice].to(device) for key in keys}
            log_probs, entropy = sequence_log_probs(
                model,
                micro,
                temperature=temperature,
                with_entropy=with_entropy,
                padding_free=padding_free,
                chunk_tokens=chunk_tokens,
            )
            if not keep:  # a repeat that keeps this rank's forward count equal to the others'
                continue
            log_prob_parts.append(log_probs.cpu())
            if entropy is not None:
                entropy_parts.append(entropy.cpu())
    entropy_all = torch.cat(entropy_parts) if with_entropy else None
    return torch.cat(log_prob_parts), entropy_all
