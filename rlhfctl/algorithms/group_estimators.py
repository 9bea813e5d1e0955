"""Four more group (outcome) advantage estimators: pass@k GRPO, OPO, GPG and GDPO.

Like GRPO and RLOO in :mod:`rlhfctl.algorithms.advantages`, each reduces a row to its score
``s_i = sum_t r_{i,t}``, compares it with the other responses to the same prompt (``index``: one group id
per row) and broadcasts one scalar over the row's valid tokens; ``returns`` equal ``advantages`` and both
are 0 on padding. The numbers are those of verl 0.9 ``verl.trainer.ppo.core_algos``
(``compute_grpo_passk_outcome_advantage``, ``compute_opo_outcome_advantage``,
``compute_gpg_outcome_advantage``, ``compute_gdpo_outcome_advantage``), checked on
tests/algorithms/fixtures/verl_estimators.pt. Everything runs under ``torch.no_grad()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .group_stats import GroupIndex, _check_inputs, _group_ids, _group_mean_std
from .masked import masked_whiten
from .estimator_table import register_advantage_estimator

__all__ = ["gdpo_advantages", "gpg_advantages", "grpo_passk_advantages", "opo_advantages"]


def _broadcast(adv: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    advantages = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return advantages, advantages


def _group_key(index: GroupIndex, row: int) -> Any:
    key = index[row]
    return key.item() if isinstance(key, (torch.Tensor, np.generic)) else key


@register_advantage_estimator("grpo_passk")
@torch.no_grad()
def grpo_passk_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training: only the best response of a group is credited (arXiv:2503.19595).

    With s_(1) >= s_(2) the two highest scores of group g and sigma_g its unbiased std:

    .. math:: A_{i^*} = \\frac{s_{(1)} - s_{(2)}}{\\sigma_g + \\epsilon}
              \\ (\\text{or } s_{(1)} - s_{(2)} \\text{ with norm\\_by\\_std=False}),\\qquad A_i = 0,\\ i \\ne i^*

    i* is the first row (lowest batch position) holding the group's maximum. Ties: when the maximum is
    shared, s_(1) - s_(2) = 0, so every row of the group gets 0 whichever row is named i* (verl names the
    one ``torch.topk`` returns; the numbers are the same). A group of one raises ``ValueError``.
    verl: ``compute_grpo_passk_outcome_advantage`` (which reads norm_adv_by_std_in_grpo from its config).
    """
    _check_inputs(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    gid, n_groups = _group_ids(index, scores.shape[0], scores.device)
    counts = torch.bincount(gid, minlength=n_groups)
    if bool((counts < 2).any()):
        row = int(torch.nonzero(counts[gid] < 2)[0])
        raise ValueError(
            f"grpo_passk: group {_group_key(index, row)!r} has a single response, but pass@k needs at least 2 "
            "per group; set rollout.n >= 2"
        )
    rows = torch.arange(scores.shape[0], device=scores.device)
    top = scores.new_full((n_groups,), -torch.inf).scatter_reduce(0, gid, scores, "amax")
    is_top = scores == top[gid]
    best = torch.full_like(top, scores.shape[0], dtype=torch.long).scatter_reduce(0, gid[is_top], rows[is_top], "amin")
    others = scores.index_fill(0, best, -torch.inf)
    second = scores.new_full((n_groups,), -torch.inf).scatter_reduce(0, gid, others, "amax")
    gap = top - second
    if norm_by_std:
        _, std, _ = _group_mean_std(scores, index)
        gap = gap / (std[best] + epsilon)
    return _broadcast(torch.zeros_like(scores).index_copy(0, best, gap), response_mask)


@register_advantage_estimator("opo")
@torch.no_grad()
def opo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO, on-policy RL with the optimal reward baseline (arXiv:2505.23585).

    The baseline of group g is its length-weighted mean score, with l_j = sum_t m_{j,t}:

    .. math:: A_i = s_i - b_g,\\qquad b_g = \\frac{\\sum_{j \\in g} l_j s_j}{\\sum_{j \\in g} l_j}

    A group of one has b = 0. A group whose responses are all empty (sum l = 0) also gets b = 0 (verl divides
    by zero there; its rows are padding only, so their advantages are 0 either way).
    verl: ``compute_opo_outcome_advantage``.
    """
    _check_inputs(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)
    gid, n_groups = _group_ids(index, scores.shape[0], scores.device)
    weighted = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(0, gid, lengths * scores)
    total = torch.zeros_like(weighted).index_add_(0, gid, lengths)
    counts = torch.bincount(gid, minlength=n_groups)
    baseline = torch.where((counts > 1) & (total > 0), weighted / total.clamp_min(1e-30), torch.zeros_like(total))
    return _broadcast(scores - baseline[gid], response_mask)


@register_advantage_estimator("gpg")
@torch.no_grad()
def gpg_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    f_norm: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546): a batch-rescaled group-mean baseline.

    With B the batch size, M the number of rows whose score is not 0 and mu_g the group mean:

    .. math:: A_i = \\alpha\\,\\frac{s_i - \\mu_g}{F_{norm}},\\qquad \\alpha = \\frac{B}{\\max(1, M)}

    (alpha corrects the gradient for the rows that carry none; F_norm = ``f_norm``, 1 by default). A group of
    one has mu = 0, so its advantage is alpha * s. Unlike GRPO there is no division by the group std (verl
    computes that std and does not use it). alpha is computed in torch's default dtype, as verl.
    verl: ``compute_gpg_outcome_advantage``.
    """
    _check_inputs(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
    mean, _, _ = _group_mean_std(scores, index)
    return _broadcast(alpha * (scores - mean) / f_norm, response_mask)


def _named_rewards(
    token_level_rewards: torch.Tensor, named_scores: Mapping[str, Any], reward_keys: Sequence[str]
) -> list[torch.Tensor]:
    """One (batch,) score per reward key, or the row sums of ``token_level_rewards`` when there is no key."""
    if not reward_keys:
        return [token_level_rewards.sum(dim=-1)]
    like = token_level_rewards
    rewards = []
    for key in reward_keys:
        if key not in named_scores:
            present = ", ".join(sorted(map(str, named_scores))) or "none"
            raise ValueError(
                f"gdpo: reward key {key!r} (algorithm.gdpo_reward_keys) is not among the named scores ({present}); "
                f"the reward function must return {key!r} in its dict"
            )
        value = named_scores[key]
        if not isinstance(value, torch.Tensor):
            value = np.asarray(value, dtype=np.float64)
        score = torch.as_tensor(value).to(dtype=like.dtype, device=like.device).reshape(-1)
        if score.shape[0] != like.shape[0]:
            raise ValueError(f"gdpo: named score {key!r} has {score.shape[0]} entries but the batch has {like.shape[0]} rows")
        rewards.append(score)
    return rewards


def _group_normalized(scores: torch.Tensor, index: GroupIndex, epsilon: float, norm_by_std: bool) -> torch.Tensor:
    """GRPO's scalar: (s - mu_g) / (sigma_g + eps), or s - mu_g (group of one: mu 0, sigma 1)."""
    mean, std, _ = _group_mean_std(scores, index)
    return (scores - mean) / (std + epsilon) if norm_by_std else scores - mean


@register_advantage_estimator("gdpo")
@torch.no_grad()
def gdpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    named_scores: Mapping[str, torch.Tensor],
    reward_keys: Sequence[str] = (),
    reward_weights: Sequence[float] | None = None,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group reward-Decoupled normalization Policy Optimization (GDPO, arXiv:2601.05242).

    Each named reward r^k (``named_scores[k]``, one scalar per row, for k in ``reward_keys``) is normalized
    within its group on its own, as GRPO does, before the rewards are combined with weights w_k
    (``reward_weights``, 1 each when None); the sum is then whitened over the batch's valid tokens:

    .. math:: \\hat A^k_i = \\frac{r^k_i - \\mu^k_g}{\\sigma^k_g + \\epsilon},\\qquad
              A_{i,t} = m_{i,t}\\,\\operatorname{whiten}_m\\Big(\\sum_k w_k \\hat A^k_i\\Big)

    (``norm_by_std=False`` drops the division by sigma). So a reward of large scale cannot drown the others.
    With no ``reward_keys`` the row sums of ``token_level_rewards`` are the single reward. A key missing from
    ``named_scores``, or ``reward_weights`` not of one weight per reward, raises ``ValueError``.
    Recipe keys: ``algorithm.gdpo_reward_keys``, ``algorithm.gdpo_reward_weights``.
    verl: ``compute_gdpo_outcome_advantage`` (which places each score on the row's last valid token and
    sums the row again: the same scalar).
    """
    _check_inputs(token_level_rewards, response_mask)
    rewards = _named_rewards(token_level_rewards, named_scores, reward_keys)
    weights = [1.0] * len(rewards) if reward_weights is None else list(reward_weights)
    if len(weights) != len(rewards):
        raise ValueError(
            f"gdpo: algorithm.gdpo_reward_weights has {len(weights)} entries for {len(rewards)} rewards "
            f"(gdpo_reward_keys: {list(reward_keys)}); give one weight per key, or null for 1 each"
        )
    w = torch.tensor(weights, dtype=token_level_rewards.dtype, device=token_level_rewards.device)
    combined = sum(w[k] * _group_normalized(r, index, epsilon, norm_by_std) for k, r in enumerate(rewards))
    mask = response_mask.to(token_level_rewards.dtype)
    advantages = masked_whiten(combined.unsqueeze(-1) * mask, mask) * mask
    return advantages, advantages
