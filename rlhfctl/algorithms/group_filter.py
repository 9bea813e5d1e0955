"""DAPO's dynamic-sampling rule: which groups of responses carry a group-relative learning signal.

A group is the ``rollout.n`` responses to one prompt (one ``uid``). When every response of a group has
the same metric value (all correct, or all wrong), a group-normalized advantage is zero for all of them:
the group costs a forward and backward pass and teaches nothing. DAPO (Yu et al., 2025,
arXiv:2503.14476, "dynamic sampling") drops such groups and samples more prompts until the batch is
full. A group of one response is kept, as verl's DAPO trainer keeps it (it has no group statistics).

Pure numpy; the trainer decides what the metric is and draws the extra prompts.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["groups_with_signal", "kept_uids_in_order"]


def groups_with_signal(values: np.ndarray, index: Sequence[Any] | np.ndarray) -> np.ndarray:
    """Per sample, whether its group's ``values`` are not all equal (or the group has one sample).

    ``values[i]`` is sample i's metric and ``index[i]`` its group id. Equality is exact: verl keeps a
    group when the standard deviation of its values is above 0, which is the same test up to floating
    rounding of the mean.
    """
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    keys = list(np.asarray(index, dtype=object).reshape(-1))
    if len(keys) != len(values):
        raise ValueError(f"groups_with_signal: {len(values)} values for {len(keys)} group ids")
    lowest: dict[Any, float] = {}
    highest: dict[Any, float] = {}
    sizes: dict[Any, int] = {}
    for key, value in zip(keys, values):
        lowest[key] = min(lowest.get(key, value), value)
        highest[key] = max(highest.get(key, value), value)
        sizes[key] = sizes.get(key, 0) + 1
    return np.array([sizes[key] == 1 or highest[key] > lowest[key] for key in keys], dtype=bool)


def kept_uids_in_order(index: Sequence[Any] | np.ndarray, keep: np.ndarray) -> list[Any]:
    """The group ids of kept samples, each once, in the order the groups first appear."""
    seen: dict[Any, None] = {}
    for key, kept in zip(np.asarray(index, dtype=object).reshape(-1), np.asarray(keep).reshape(-1)):
        if kept:
            seen.setdefault(key, None)
    return list(seen)
