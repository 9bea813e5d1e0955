"""Losses on preference pairs, as pure tensor functions: Bradley-Terry (reward models) and DPO (policies).

Both take one value per pair for the chosen and the rejected response and return the mean loss with
its statistics (detached), so a worker can train with them and a driver can evaluate with them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["bradley_terry_loss", "dpo_loss"]


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: float = 0.0
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``mean(-log sigmoid(r_chosen - r_rejected - margin))`` with ``accuracy`` (share of pairs scored
    the right way round) and ``margin`` (mean ``r_chosen - r_rejected``)."""
    difference = chosen.float() - rejected.float()
    loss = -F.logsigmoid(difference - float(margin)).mean()
    return loss, {"accuracy": (difference > 0).float().mean(), "margin": difference.detach().mean()}


def dpo_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``mean(-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))))`` from summed response log-probs,
    with the implicit rewards ``rewards/chosen``, ``rewards/rejected``, ``rewards/margin`` and
    ``rewards/accuracy`` (share of pairs whose chosen implicit reward is the higher)."""
    chosen_reward = float(beta) * (chosen.float() - ref_chosen.float())
    rejected_reward = float(beta) * (rejected.float() - ref_rejected.float())
    margin = chosen_reward - rejected_reward
    loss = -F.logsigmoid(margin).mean()
    return loss, {
        "rewards/chosen": chosen_reward.detach().mean(),
        "rewards/rejected": rejected_reward.detach().mean(),
        "rewards/margin": margin.detach().mean(),
        "rewards/accuracy": (margin > 0).float().mean(),
    }
