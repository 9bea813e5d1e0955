"""Sequence balancing across data-parallel ranks."""

from __future__ import annotations

import numpy as np

from rlhfctl.trainer.balance import balanced_order, shard_token_totals


def test_balanced_order_evens_out_token_totals_per_shard():
    tokens = np.array([100, 90, 80, 70, 10, 9, 8, 7])  # contiguous halves: 340 vs 34
    order = balanced_order(tokens, 2)
    assert sorted(order.tolist()) == list(range(8))  # a permutation
    assert shard_token_totals(tokens, 2) == [340, 34]
    after = shard_token_totals(tokens[order], 2)
    assert after == [187, 187]  # 100+70+10+7 and 90+80+9+8
    assert len(order) // 2 == 4  # equal sample counts per shard


def test_rows_keep_their_order_inside_a_shard_and_odd_sizes_are_left_alone():
    order = balanced_order(np.array([5, 1, 4, 2, 3, 3]), 3)
    shards = order.reshape(3, 2)
    assert all(shard[0] < shard[1] for shard in shards)
    assert balanced_order(np.array([1, 2, 3]), 2).tolist() == [0, 1, 2]
    assert balanced_order(np.array([3, 1]), 1).tolist() == [0, 1]
