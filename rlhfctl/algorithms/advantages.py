"""Advantage estimators: token-level rewards -> (advantages, returns).

All inputs and outputs are (batch, response_len) tensors over the response tokens only,
right-padded; ``response_mask`` is 1 on a generated token and 0 on padding. The numerics follow
``verl.trainer.ppo.core_algos`` (``compute_gae_advantage_return``,
``compute_grpo_outcome_advantage``, ``compute_rloo_outcome_advantage``,
``compute_reinforce_plus_plus_outcome_advantage``, ``compute_remax_outcome_advantage``).

Outcome estimators (GRPO, RLOO) reduce each row to a score ``s_i = sum_t r_{i,t}`` (summed over
every position, so rewards must already be 0 on padding, as a reward manager writes them) and
broadcast one scalar advantage over the valid tokens. Group estimators take ``index``, one
group id per row: responses sampled from the same prompt share an id.

Everything runs under ``torch.no_grad()``: advantages and returns are targets, not graph nodes.
"""

from __future__ import annotations

import torch

from .group_stats import GroupIndex, _check_inputs, _group_mean_std
from .masked import masked_whiten
from .estimator_table import register_advantage_estimator

__all__ = [
    "gae_advantages",
    "grpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages",
    "remax_advantages",
]

@register_advantage_estimator("gae")
@torch.no_grad()
def gae_advantages(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438).

    Backwards over t, carrying ``nextvalue`` and ``lastgae`` (both 0 after the last token):

    .. math::
        \\delta_t = r_t + \\gamma V_{t+1} - V_t, \\qquad
        \\hat A_t = \\delta_t + \\gamma\\lambda \\hat A_{t+1}

    At a masked position (m_t = 0) both carries pass through unchanged, so padding inside a
    response is skipped: ``nextvalue = m V_t + (1-m) nextvalue``,
    ``lastgae = m lastgae_new + (1-m) lastgae``. Then

    - ``returns = A + V`` (before whitening; masked positions keep ``carry + V_t``, as verl),
    - ``advantages = masked_whiten(A, mask) * mask`` (unbiased variance over valid tokens;
      verl leaves whitened values at padding, here they are zeroed).

    Source: verl ``compute_gae_advantage_return``; CleanRL ``ppo.py`` for the recursion.
    """
    _check_inputs(token_level_rewards, response_mask, values=values)
    mask = response_mask.to(token_level_rewards.dtype)
    values = values.to(token_level_rewards.dtype)
    next_value = torch.zeros_like(token_level_rewards[:, 0])
    last_gae = torch.zeros_like(next_value)
    reversed_adv = []
    for t in reversed(range(token_level_rewards.shape[1])):
        m = mask[:, t]
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        new_gae = delta + gamma * lam * last_gae
        next_value = values[:, t] * m + (1.0 - m) * next_value
        last_gae = new_gae * m + (1.0 - m) * last_gae
        reversed_adv.append(last_gae)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    returns = advantages + values
    advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


@register_advantage_estimator("grpo")
@torch.no_grad()
def grpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Relative Policy Optimization outcome advantage (Shao et al. 2024, DeepSeekMath,
    arXiv:2402.03300).

    With s_i the row score and mu_g, sigma_g the mean and unbiased std of the scores in the
    row's group g:

    .. math:: A_i = \\frac{s_i - \\mu_g}{\\sigma_g + \\epsilon}
              \\quad\\text{or, with norm\\_by\\_std=False (Dr. GRPO, arXiv:2503.20783),}\\quad
              A_i = s_i - \\mu_g

    broadcast over the row's valid tokens (``A_i * mask``). A group of one has mu=0, sigma=1, so
    its advantage is ``s / (1 + eps)`` (``s`` unnormalised). ``returns = advantages``.
    Source: verl ``compute_grpo_outcome_advantage``.
    """
    _check_inputs(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    mean, std, _ = _group_mean_std(scores, index)
    if norm_by_std:
        adv = (scores - mean) / (std + epsilon)
    else:
        adv = scores - mean
    advantages = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return advantages, advantages


@register_advantage_estimator("rloo")
@torch.no_grad()
def rloo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE Leave-One-Out (Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for
    free!"; Ahmadian et al. 2024, arXiv:2402.14740).

    The baseline of row i is the mean score of the other n-1 rows of its group:

    .. math:: A_i = s_i - \\frac{1}{n-1}\\sum_{j \\ne i} s_j
              = \\frac{n}{n-1} s_i - \\frac{n}{n-1}\\mu_g

    with mu_g the group mean including row i. A group of one has no other sample: its
    advantage is its raw score (no baseline). Broadcast over valid tokens;
    ``returns = advantages``. Source: verl ``compute_rloo_outcome_advantage``.
    """
    _check_inputs(token_level_rewards, response_mask)
    scores = token_level_rewards.sum(dim=-1)
    mean, _, counts = _group_mean_std(scores, index)
    factor = counts / (counts - 1).clamp_min(1)
    adv = torch.where(counts > 1, scores * factor - mean * factor, scores)
    advantages = adv.unsqueeze(-1) * response_mask.to(adv.dtype)
    return advantages, advantages


@register_advantage_estimator("reinforce_plus_plus")
@torch.no_grad()
def reinforce_pp_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return, whitened over the batch.

    Backwards over t with a running return G (0 after the last token):

    .. math:: G_t = r_t + \\gamma G_{t+1}, \\qquad \\text{returns}_t = G_t,
              \\qquad G \\leftarrow G \\cdot m_t

    (the running return is reset to 0 after a masked position, as verl). Then
    ``advantages = masked_whiten(returns, mask) * mask``; ``returns`` are not masked.
    Source: verl ``compute_reinforce_plus_plus_outcome_advantage``.
    """
    _check_inputs(token_level_rewards, response_mask)
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@register_advantage_estimator("remax")
@torch.no_grad()
def remax_advantages(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505): REINFORCE with a greedy-decoding baseline.

    With b_i the reward of the greedy response to row i's prompt:

    .. math:: \\text{returns}_{i,t} = \\sum_{t' \\ge t} m_{i,t'} r_{i,t'}, \\qquad
              A_{i,t} = (\\text{returns}_{i,t} - b_i)\\, m_{i,t}

    Both outputs are multiplied by the mask (verl leaves the returns unmasked; they agree on
    right-padded rows). Source: verl ``compute_remax_outcome_advantage``.
    """
    _check_inputs(token_level_rewards, response_mask)
    mask = response_mask.to(token_level_rewards.dtype)
    baselines = reward_baselines.reshape(-1).to(token_level_rewards.dtype)
    if baselines.shape[0] != token_level_rewards.shape[0]:
        raise ValueError(
            f"reward_baselines has {baselines.shape[0]} entries but the batch has {token_level_rewards.shape[0]} rows"
        )
    returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask
    advantages = (returns - baselines.unsqueeze(-1)) * mask
    return advantages, returns
