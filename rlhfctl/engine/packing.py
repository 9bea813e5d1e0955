"""Padding-free forward passes: a micro-batch's sequences run as one packed row, no pad token in the model.

A padded micro-batch of ``B`` rows and width ``W`` holds ``sum(attention_mask)`` real tokens; packing
keeps just those, in row order, as one ``(1, T)`` row whose ``position_ids`` restart at 0 with every
sequence (the positions the padded pass uses, so rotary embeddings agree). Projections, MLPs, norms
and the LM head then run on ``T`` tokens instead of ``B x W``.

Attention must stay within each sequence. The packed call passes the sequences' cumulative lengths
(``cu_seq_lens_q`` / ``_k``, transformers' varlen arguments): on CUDA with flash-attention installed
(``attn_implementation: flash_attention_2``) transformers runs its varlen kernel from them; for ``sdpa``
this module registers a kernel that lays each sequence's queries, keys and values out as right-padded
rows and runs causal sdpa on them (right padding needs no mask: a real query never sees a later pad
key), then gathers the real positions back. Calls without those arguments (generation, padded rows)
run transformers' sdpa unchanged. ``eager`` (and models whose forward does not pass extra arguments
on) get no mask and transformers' own packed-sequence mask from the restarting positions: correct, but
a dense ``T x T`` mask, so its cost grows with the square of the packed length.

Only the positions a caller reads are scored: log-probs and entropies at the response tokens, values at
the response positions, the sequence score at each sequence's last token.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.utils.weak import WeakIdKeyDictionary
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface

from rlhfctl.algorithms import token_log_probs
from rlhfctl.engine.forward import _accepts, base_model, scoring_head
from rlhfctl.models.loading import token_values

__all__ = [
    "PACKING_FAMILIES",
    "PackedRows",
    "pack_rows",
    "packed_response_log_probs",
    "packed_response_values",
    "packed_sequence_scores",
    "packed_token_nll",
    "packing_unsupported",
    "use_padding_free",
]

#: Model families whose decoder passes ``position_ids`` to attention and is tested packed (tests/workers/test_packing.py).
PACKING_FAMILIES = frozenset({"qwen2", "qwen3", "llama", "mistral"})
_FLASH_PREFIX = "flash_attention"


# ------------------------------------------------------------------ which models, and the one default rule


def packing_unsupported(model: nn.Module) -> str | None:
    """Why ``model`` cannot run packed rows, or None when it can."""
    config = getattr(base_model(model), "config", None)
    if config is None:
        return f"{type(base_model(model)).__name__} has no transformers config"
    family = getattr(config, "model_type", None)
    if family not in PACKING_FAMILIES:
        return f"model family {family!r} is not one of the packed-tested families {sorted(PACKING_FAMILIES)}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "the model uses sliding-window attention"
    inner = base_model(model)
    if type(inner).__name__.endswith("ForSequenceClassification") and not isinstance(getattr(inner, "score", None), nn.Module):
        return f"{type(inner).__name__} has no score head to read packed hidden states with"
    kernel = getattr(config, "_attn_implementation", None)
    if kernel not in ("sdpa", "eager") and not str(kernel).startswith(_FLASH_PREFIX):
        return f"attention kernel {kernel!r} (packed rows run on sdpa, eager or flash_attention_*)"
    return None


def use_padding_free(setting: bool | None, model: nn.Module, key: str) -> bool:
    """``roles.<role>.padding_free`` resolved: null means on wherever the model supports packing.

    ``true`` on a model that cannot pack raises, naming ``key``.
    """
    reason = packing_unsupported(model)
    if setting is None:
        return reason is None
    if setting and reason is not None:
        raise ValueError(f"{key} is true, but {reason}; set it to false (or null for the default)")
    return bool(setting)


# ------------------------------------------------------------------ packing


@dataclass(frozen=True)
class PackedRows:
    """One packed row and where each padded cell went: ``slot[b, j]`` is its packed index, -1 for a pad."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    slot: torch.Tensor


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> PackedRows:
    """Keep the real tokens of (B, W) rows, row by row, as one (1, T) row with their positions."""
    keep = attention_mask.bool()
    slot = torch.full(input_ids.shape, -1, dtype=torch.long, device=input_ids.device)
    slot[keep] = torch.arange(int(keep.sum()), device=input_ids.device)
    return PackedRows(input_ids[keep].unsqueeze(0), position_ids[keep].unsqueeze(0), slot)


def _sequence_starts(packed: PackedRows) -> tuple[torch.Tensor, int]:
    """``cu_seq_lens`` (int32, sequences delimited by restarting positions) and the longest length."""
    positions = packed.position_ids[0]
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[1:] = positions[1:] != positions[:-1] + 1
    edges = torch.cat([starts.nonzero()[:, 0], positions.new_tensor([positions.shape[0]])])
    return edges.to(torch.int32), int((edges[1:] - edges[:-1]).max())


def _packed_kwargs(model: nn.Module, packed: PackedRows) -> dict[str, Any]:
    """Forward arguments for a packed row: the varlen lengths where the model passes them on to attention
    (an all-ones mask then, so sdpa builds no mask), else no mask (transformers finds the sequences
    from the positions and masks across them)."""
    kwargs: dict[str, Any] = {"input_ids": packed.input_ids, "position_ids": packed.position_ids, "attention_mask": None}
    config = getattr(base_model(model), "config", None)
    kernel = getattr(config, "_attn_implementation", None)
    if _takes_kwargs(model) and (kernel == "sdpa" or str(kernel).startswith(_FLASH_PREFIX)):
        cu_seq_lens, longest = _sequence_starts(packed)
        kwargs.update(cu_seq_lens_q=cu_seq_lens, cu_seq_lens_k=cu_seq_lens, max_length_q=longest, max_length_k=longest)
        if kernel == "sdpa":
            kwargs["attention_mask"] = torch.ones_like(packed.input_ids)
            # Once per micro-batch, from sizes known on the host: every layer's attention finds it here.
            _LAYOUTS[cu_seq_lens] = _build_layout(cu_seq_lens, packed.input_ids.shape[1], longest)
    return kwargs


@functools.lru_cache(maxsize=64)
def _forward_takes_kwargs(model_type: type) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(model_type.forward).parameters.values())


def _takes_kwargs(model: nn.Module) -> bool:
    return _forward_takes_kwargs(type(base_model(model)))


def _packed_call(
    model: nn.Module,
    packed: PackedRows,
    keep: torch.Tensor,
    scoring: Callable[[Callable[[torch.Tensor], torch.Tensor]], contextlib.AbstractContextManager] | None = None,
) -> torch.Tensor:
    """Logits of one packed row at the packed positions ``keep`` (only those, where the model allows); with
    ``scoring`` (``scoring(select)``, see ``rlhfctl.engine.forward.scoring_head``) the head's scores there instead."""
    kwargs = _packed_kwargs(model, packed)
    accepted = _accepts(model)
    if "use_cache" in accepted:
        kwargs["use_cache"] = False
    kept = "logits_to_keep" in accepted
    if kept:
        kwargs["logits_to_keep"] = keep
    if scoring is None:
        logits = model(**kwargs).logits[0]
        return logits if kept else logits[keep]

    def select(hidden: torch.Tensor) -> torch.Tensor:
        return hidden[0] if kept else hidden[0, keep]

    with scoring(select):
        return model(**kwargs).logits


def _scatter(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """(B, R) zeros holding ``values`` at the True cells of ``where``."""
    out = values.new_zeros(where.shape)
    return out.masked_scatter(where, values) if values.requires_grad else out.index_put((where,), values)


def _prediction_cells(packed: PackedRows, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For target columns ``first .. first+count-1``: the packed index of each one's predicting token
    (the column before), and the cells where both tokens are real."""
    source = packed.slot[:, first - 1 : first - 1 + count]
    valid = (source >= 0) & (packed.slot[:, first : first + count] >= 0)
    return source[valid], valid


def packed_response_log_probs(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    position_ids: torch.Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (B, R) of ``batch['responses']`` (and entropies) from one packed row; 0 at pad cells.

    ``chunk_tokens > 0`` has the output layer score that many tokens at a time (a model with an
    ``output_layer``); 0 computes the logits of every scored token at once.
    """
    responses = batch["responses"]
    width = responses.shape[1]
    packed = pack_rows(batch["input_ids"], batch["attention_mask"], position_ids)
    keep, valid = _prediction_cells(packed, batch["input_ids"].shape[1] - width, width)
    targets = responses[valid]
    options = {"temperature": temperature, "with_entropy": with_entropy, "entropy_grad": entropy_grad}
    if chunk_tokens > 0:
        scoring = functools.partial(scoring_head, model, targets=targets, chunk_tokens=chunk_tokens, **options)
        scores = _packed_call(model, packed, keep, scoring)
        log_probs, entropy = scores[:, 0], scores[:, 1] if with_entropy else None
    else:
        log_probs, entropy = token_log_probs(_packed_call(model, packed, keep), targets, **options)
    return _scatter(log_probs, valid), _scatter(entropy, valid) if entropy is not None else None


def packed_response_values(model: nn.Module, batch: Mapping[str, torch.Tensor], position_ids: torch.Tensor) -> torch.Tensor:
    """Values (B, R) at the response positions (read at P + t - 1) from one packed row; 0 at pad cells."""
    width = batch["responses"].shape[1]
    packed = pack_rows(batch["input_ids"], batch["attention_mask"], position_ids)
    keep, valid = _prediction_cells(packed, batch["input_ids"].shape[1] - width, width)
    kwargs = _packed_kwargs(model, packed)
    if set(kwargs) == {"input_ids", "position_ids", "attention_mask"}:
        values = token_values(model, packed.input_ids, None, packed.position_ids)
    else:
        output = model(**kwargs)
        values = output if isinstance(output, torch.Tensor) else output.logits[..., 0]
    values = values[0, keep]
    return _scatter(values.float(), valid)


def packed_token_nll(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token NLL (B, T-1) of ``input_ids[:, 1:]`` where ``loss_mask[:, 1:]`` is set, from one packed
    row, with that mask; other cells are 0. Rows may hold several demonstrations (restarting positions)."""
    ids, loss_mask = batch["input_ids"], batch["loss_mask"]
    packed = pack_rows(ids, batch["attention_mask"], batch["position_ids"])
    keep, valid = _prediction_cells(packed, 1, ids.shape[1] - 1)
    weight = loss_mask[:, 1:].to(torch.float32)
    keep = keep[weight[valid] > 0]
    valid = valid & (weight > 0)
    logits = _packed_call(model, packed, keep).float()
    nll = torch.nn.functional.cross_entropy(logits, ids[:, 1:][valid], reduction="none")
    return _scatter(nll, valid), weight * valid


def packed_sequence_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Sequence-classifier scores (B,) from one packed row, read at the token transformers reads
    (the last one that is not the pad token). An FSDP2-sharded model runs padded through its root forward,
    which gathers the root's own shards (embeddings, score head): the packed path calls the backbone directly."""
    if isinstance(model, FSDPModule):
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0].float()
    inner = base_model(model)
    pad = inner.config.pad_token_id
    columns = torch.arange(input_ids.shape[1], device=input_ids.device)
    last = (columns * (input_ids != pad)).argmax(-1) if pad is not None else torch.full_like(input_ids[:, 0], -1)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    packed = pack_rows(input_ids, attention_mask, position_ids)
    keep = packed.slot[torch.arange(input_ids.shape[0], device=input_ids.device), last]
    if bool((keep < 0).any()):
        raise ValueError("a sequence's last non-pad token is masked out; it cannot be scored packed")
    backbone = getattr(inner, inner.base_model_prefix)
    hidden = backbone(**_packed_kwargs(backbone, packed)).last_hidden_state
    return inner.score(hidden[0, keep]).float()[:, 0]


# ------------------------------------------------------------------ varlen attention for sdpa


@dataclass(frozen=True)
class _Layout:
    rows: int
    width: int
    real: torch.Tensor  # (T,) padded cell of each packed token


#: The layout of each live packed row's ``cu_seq_lens`` tensor, built once by :func:`_packed_kwargs`.
_LAYOUTS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _build_layout(cu_seq_lens: torch.Tensor, total: int, longest: int) -> _Layout:
    """Sequences of a packed row of ``total`` tokens, the longest ``longest``, from their cumulative lengths
    (no host sync: the sizes come from the caller)."""
    lengths = (cu_seq_lens[1:] - cu_seq_lens[:-1]).long()
    device = cu_seq_lens.device
    sequence = torch.repeat_interleave(torch.arange(lengths.shape[0], device=device), lengths, output_size=total)
    column = torch.arange(total, device=device) - cu_seq_lens[:-1].long()[sequence]
    return _Layout(lengths.shape[0], longest, sequence * longest + column)


@functools.lru_cache(maxsize=1)
def _layout_of(cu_seq_lens: torch.Tensor) -> _Layout:
    """The layout of ``cu_seq_lens`` that :func:`_packed_kwargs` did not build (reads its sizes: host syncs)."""
    lengths = cu_seq_lens[1:] - cu_seq_lens[:-1]
    return _build_layout(cu_seq_lens, int(cu_seq_lens[-1]), int(lengths.max()))


def _unpack(states: torch.Tensor, layout: _Layout) -> torch.Tensor:
    """(1, heads, T, dim) -> (rows, heads, width, dim), right-padded with zeros."""
    flat = states[0].transpose(0, 1)
    padded = flat.new_zeros(layout.rows * layout.width, *flat.shape[1:]).index_copy(0, layout.real, flat)
    return padded.view(layout.rows, layout.width, *flat.shape[1:]).transpose(1, 2)


def _sdpa_or_varlen(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> tuple[torch.Tensor, Any]:
    """transformers' sdpa kernel, except on a packed row given ``cu_seq_lens_q``: causal sdpa per sequence.

    The packed call passes an all-ones mask, so transformers builds no ``T x T`` mask; the sequence
    boundaries come from ``cu_seq_lens_q`` (also what flash-attention's varlen kernel reads), which
    activation checkpointing replays with the layer, so recomputation takes this path too.
    """
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    packed = cu_seq_lens is not None and query.shape[0] == 1 and key.shape[2] == query.shape[2]
    layout = _LAYOUTS.get(cu_seq_lens) if packed else None
    if layout is None and packed and int(cu_seq_lens[-1]) == query.shape[2]:
        layout = _layout_of(cu_seq_lens)  # cu_seq_lens from another caller than _packed_kwargs
    if layout is None or layout.real.shape[0] != query.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    out, _ = sdpa_attention_forward(
        module, _unpack(query, layout), _unpack(key, layout), _unpack(value, layout), None, **kwargs
    )
    return out.reshape(layout.rows * layout.width, *out.shape[2:]).index_select(0, layout.real).unsqueeze(0), None


# transformers' documented extension point; the kernel is unchanged for every call without cu_seq_lens_q.
AttentionInterface.register("sdpa", _sdpa_or_varlen)
