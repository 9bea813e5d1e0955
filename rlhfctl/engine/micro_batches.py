"""Split a mini-batch into micro-batches (by rows or by a token budget) and weigh their losses.

Gradient accumulation must give the gradient of the whole mini-batch's loss, however it is split. A
micro-batch's loss is a mean over its own rows (``seq-mean-*``, the ``geo_mean`` and ``sapo`` policy losses
in any mode, DPO, reward-model pairs) or over its own loss tokens (``token-mean``, SFT), so its weight is its
share of the mini-batch's rows or tokens: ``sum_i share_i * mean_i = mean``. (Dividing each by the number
of micro-batches is exact only when every micro-batch holds the same number of rows and tokens.)

``roles.<role>.micro_batch_tokens`` forms micro-batches by a budget of real tokens (prompt + response,
pad excluded) instead of a row count, as verl's ``use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu``:
rows go, longest first, into the first micro-batch with room. Under data parallelism every rank then
runs the largest count any rank needs (splitting its fullest micro-batches), so gradient
synchronisation is entered the same number of times on every rank.

The no-gradient scoring passes (log-probs, values, reward-model scores) slice their rows with
:func:`scoring_slices`. Where each forward gathers FSDP2 units (``rlhfctl.engine.placement.forwards_are_collective``),
a rank with fewer micro-batches than another runs its last one again, as often as it must, and drops
those results, so every rank enters the same number of forwards.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlhfctl.algorithms.policy_losses import policy_loss_averages_rows

__all__ = [
    "TokenBudgetError",
    "loss_token_counts",
    "micro_batch_shares",
    "scoring_slices",
    "split_by_rows",
    "split_by_tokens",
]


class TokenBudgetError(ValueError):
    """A row is longer than ``micro_batch_tokens``: no micro-batch can hold it."""


def split_by_rows(indices: torch.Tensor, rows: int | None) -> list[torch.Tensor]:
    """Consecutive pieces of ``rows`` indices (one piece when ``rows`` is None)."""
    step = len(indices) if not rows else max(1, int(rows))
    return list(indices.split(step))


def _first_fit(indices: torch.Tensor, lengths: torch.Tensor, budget: int) -> list[list[int]]:
    order = torch.argsort(lengths, descending=True, stable=True)
    bins: list[list[int]] = []
    loads: list[int] = []
    for position in order.tolist():
        length = int(lengths[position])
        target = next((number for number, load in enumerate(loads) if load + length <= budget), None)
        if target is None:
            bins.append([])
            loads.append(0)
            target = len(bins) - 1
        bins[target].append(int(indices[position]))
        loads[target] += length
    return bins


def _largest_counts(counts: list[int], device: torch.device) -> list[int]:
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return counts
    value = torch.tensor(counts, dtype=torch.int64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return [int(item) for item in value.tolist()]


def _largest_count(count: int, device: torch.device) -> int:
    return _largest_counts([count], device)[0]


def split_by_tokens(
    indices: torch.Tensor, row_tokens: torch.Tensor, budget: int, *, key: str, device: torch.device
) -> list[torch.Tensor]:
    """Micro-batches of ``indices`` holding at most ``budget`` tokens each (``row_tokens[i]`` per row),
    as many on every rank; raises :class:`TokenBudgetError` naming ``key`` for a row over the budget."""
    lengths = row_tokens[indices].long()
    longest = int(lengths.max()) if len(lengths) else 0
    if longest > budget:
        raise TokenBudgetError(
            f"{key}={budget} is smaller than one sequence ({longest} tokens); raise it to at least the longest "
            "prompt + response"
        )
    bins = _first_fit(indices, lengths, budget)
    wanted = _largest_count(len(bins), device)
    tokens = dict(zip(indices.tolist(), lengths.tolist()))
    while len(bins) < wanted:  # split the fullest splittable micro-batch in two (each still within budget)
        splittable = [number for number, members in enumerate(bins) if len(members) > 1]
        fullest = max(splittable, key=lambda number: sum(tokens[row] for row in bins[number]))
        members = bins.pop(fullest)
        bins += [members[0::2], members[1::2]]
    return [torch.tensor(members, dtype=torch.long) for members in bins]


def scoring_slices(rows: int, size: int | None, *, balance: bool, device: torch.device) -> list[tuple[slice, bool]]:
    """Row slices of a scoring pass, ``size`` rows each (one slice when None), with whether each result is
    kept. With ``balance`` every rank gets the largest count any rank needs: the extra slices repeat the
    last one (kept False), so a collective forward is entered as often on every rank."""
    step = rows if not size else max(1, int(size))
    pieces = [(slice(start, start + step), True) for start in range(0, rows, max(1, step))]
    if not balance:
        return pieces
    wanted, empty = _largest_counts([len(pieces), int(not pieces)], device)
    if empty:  # raised on every rank, lest the others wait for this one's forwards
        raise ValueError("a rank got 0 rows for a scoring pass whose forwards gather FSDP2 units; every rank needs a row")
    return pieces + [(pieces[-1][0], False)] * (wanted - len(pieces))


def micro_batch_shares(pieces: list[torch.Tensor], loss_tokens: torch.Tensor | None) -> list[float]:
    """Each piece's share of the mini-batch: of its loss tokens (``loss_tokens[i]`` per row) when given
    and not all zero, else of its rows."""
    if loss_tokens is not None:
        counts = [float(loss_tokens[piece].sum()) for piece in pieces]
        total = sum(counts)
        if total > 0:
            return [count / total for count in counts]
    rows = sum(len(piece) for piece in pieces)
    return [len(piece) / rows for piece in pieces]


def loss_token_counts(mask: torch.Tensor, agg: str, policy_loss: str | None = None) -> torch.Tensor | None:
    """Per-row loss tokens that weigh a micro-batch under ``agg`` (``token-mean``), or None (row share: the
    ``seq-mean-*`` modes, and a ``policy_loss`` registered with ``averages_rows`` — GMPO, SAPO — average over rows).

    One share weighs a micro-batch's whole loss: with a row-mean policy loss under ``token-mean``, an entropy
    bonus or KL loss (token means) is then exact only when the micro-batches hold tokens in proportion to rows.
    """
    if agg != "token-mean" or (policy_loss is not None and policy_loss_averages_rows(policy_loss)):
        return None
    return mask.sum(dim=-1)
