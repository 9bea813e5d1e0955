"""DAPO's group filter: a group is kept when its samples' metric differs (or it has one sample)."""

from __future__ import annotations

import numpy as np
import pytest

from rlhfctl.algorithms.group_filter import groups_with_signal, kept_uids_in_order


def test_groups_whose_samples_all_score_the_same_are_dropped():
    values = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5])
    index = np.array(["a", "a", "b", "b", "c", "c", "d"], dtype=object)
    keep = groups_with_signal(values, index)
    # a: all 1 -> dropped; b: 0 and 1 -> kept; c: all 0 -> dropped; d: a group of one -> kept (as verl does).
    assert keep.tolist() == [False, False, True, True, False, False, True]
    assert kept_uids_in_order(index, keep) == ["b", "d"]


def test_groups_need_not_be_contiguous_and_keep_their_first_appearance_order():
    index = np.array([2, 1, 2, 1, 3, 3], dtype=object)
    keep = groups_with_signal(np.array([0.0, 5.0, 1.0, 5.0, 2.0, 3.0]), index)
    assert keep.tolist() == [True, False, True, False, True, True]
    assert kept_uids_in_order(index, keep) == [2, 3]


def test_a_tiny_difference_counts_as_signal():
    keep = groups_with_signal(np.array([0.1 + 0.2, 0.3]), np.array(["g", "g"], dtype=object))
    assert keep.tolist() == [True, True]  # 0.30000000000000004 != 0.3: the rewards do differ


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="3 values for 2 group ids"):
        groups_with_signal(np.zeros(3), ["a", "b"])
