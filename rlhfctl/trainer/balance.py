"""Sequence balancing: an order of samples that gives every data-parallel rank a similar token count."""

from __future__ import annotations

import numpy as np


def balanced_order(token_counts: np.ndarray, parts: int) -> np.ndarray:
    """A permutation of the rows such that ``parts`` contiguous, equal-size shards have similar token totals.

    Greedy longest-first: each row, longest first, goes to the shard with the fewest tokens that still
    has room. Rows keep their original order inside a shard. With a row count that ``parts`` does not
    divide, the identity is returned (ALL_TO_ALL pads such batches itself).
    """
    counts = np.asarray(token_counts, dtype=np.int64)
    rows = len(counts)
    if parts <= 1 or rows % parts:
        return np.arange(rows)
    size = rows // parts
    shards: list[list[int]] = [[] for _ in range(parts)]
    totals = np.zeros(parts, dtype=np.int64)
    for row in np.argsort(-counts, kind="stable"):
        open_shards = [index for index in range(parts) if len(shards[index]) < size]
        target = min(open_shards, key=lambda index: (totals[index], index))
        shards[target].append(int(row))
        totals[target] += counts[row]
    return np.concatenate([np.sort(np.array(shard, dtype=np.int64)) for shard in shards])


def shard_token_totals(token_counts: np.ndarray, parts: int) -> list[int]:
    """Tokens in each of ``parts`` contiguous equal shards (for metrics and tests)."""
    counts = np.asarray(token_counts, dtype=np.int64)
    return [int(chunk.sum()) for chunk in np.array_split(counts, parts)]
