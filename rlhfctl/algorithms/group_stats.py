"""Per-group statistics the group estimators share (GRPO, RLOO, pass@k, OPO, GPG, GDPO): group ids, means, stds.

A module of its own, below both estimator modules: ``registry`` imports the estimators when it is first
imported, so an estimator module that took these from another estimator module could meet it half-initialized
(``import rlhfctl.algorithms as a; a.gae_advantages`` on a fresh interpreter failed that way).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["GroupIndex"]

GroupIndex = Sequence[Any] | np.ndarray | torch.Tensor


def _check_inputs(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **others: torch.Tensor) -> None:
    if token_level_rewards.dim() != 2:
        raise ValueError(
            f"token_level_rewards must be (batch, response_len), got shape {tuple(token_level_rewards.shape)}"
        )
    shape = token_level_rewards.shape
    for name, tensor in {"response_mask": response_mask, **others}.items():
        if tensor.shape != shape:
            raise ValueError(f"{name} shape {tuple(tensor.shape)} does not match token_level_rewards {tuple(shape)}")


def _group_ids(index: GroupIndex, batch_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Map arbitrary hashable group ids to 0..G-1 in order of first appearance."""
    if isinstance(index, torch.Tensor):
        keys = index.detach().cpu().reshape(-1).tolist()
    elif isinstance(index, np.ndarray):
        keys = index.reshape(-1).tolist()
    else:
        keys = list(index)
    if len(keys) != batch_size:
        raise ValueError(f"index has {len(keys)} group ids but the batch has {batch_size} rows")
    dense: dict[Any, int] = {}
    ids = [dense.setdefault(key, len(dense)) for key in keys]
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def _group_mean_std(
    scores: torch.Tensor, index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group mean, unbiased group std and group size, each of shape (batch,).

    A group of one has mean 0 and std 1 (verl's convention), so its score passes through.
    """
    gid, n_groups = _group_ids(index, scores.shape[0], scores.device)
    counts = torch.bincount(gid, minlength=n_groups).to(scores.dtype)
    sums = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, gid, scores)
    mean = sums / counts
    sq_dev = torch.zeros_like(sums).index_add_(0, gid, (scores - mean[gid]) ** 2)
    std = torch.sqrt(sq_dev / (counts - 1).clamp_min(1))
    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[gid], std[gid], counts[gid]
