"""Micro-batch weights: accumulating share * loss over micro-batches gives the whole mini-batch's loss and
gradient, for every policy loss and aggregation, geo_mean and sapo (row means in every mode) included."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.algorithms import LOSS_AGG_MODES, POLICY_LOSSES, get_policy_loss
from rlhfctl.algorithms.policy_losses import policy_loss_averages_rows
from rlhfctl.engine.micro_batches import (
    loss_token_counts,
    micro_batch_shares,
    split_by_rows,
)

SETTINGS = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0, "tau_pos": 1.0, "tau_neg": 1.05,
            "loss_scale_factor": None}


def mini_batch() -> dict[str, torch.Tensor]:
    """Six rows of very uneven lengths, so micro-batches hold tokens out of proportion to their rows."""
    generator = torch.Generator().manual_seed(7)
    lengths = torch.tensor([8, 1, 2, 8, 7, 1])
    mask = (torch.arange(8).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    old = -torch.rand(6, 8, generator=generator, dtype=torch.float64) * 2
    new = old + torch.randn(6, 8, generator=generator, dtype=torch.float64) * 0.2
    advantages = torch.randn(6, 1, generator=generator, dtype=torch.float64).expand(6, 8) * mask
    return {"old_log_prob": old, "log_prob": new, "advantages": advantages, "response_mask": mask}


def loss_and_grad(name: str, agg: str, batch: dict[str, torch.Tensor], pieces, shares) -> tuple[float, torch.Tensor]:
    """sum_i share_i * loss(piece_i) and its gradient w.r.t. the log-probs, as gradient accumulation forms them."""
    log_prob = batch["log_prob"].clone().requires_grad_(True)
    total = 0.0
    for piece, share in zip(pieces, shares):
        loss, _ = get_policy_loss(name)(
            batch["old_log_prob"][piece], log_prob[piece], batch["advantages"][piece],
            batch["response_mask"][piece], agg, SETTINGS,
        )
        (loss * share).backward()
        total += float(loss.detach()) * share
    return total, log_prob.grad


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
# clip_cov draws tokens at random and kl_cov picks its top-k over the batch it sees: neither splits over rows
@pytest.mark.parametrize("name", sorted(set(POLICY_LOSSES) - {"clip_cov", "kl_cov"}))
def test_micro_batch_shares_give_the_whole_batch_loss_and_gradient(name, agg):
    batch = mini_batch()
    rows = torch.arange(6)
    whole = loss_and_grad(name, agg, batch, [rows], [1.0])
    pieces = split_by_rows(rows, 4)  # 4 rows (19 tokens) and 2 rows (8 tokens)
    shares = micro_batch_shares(pieces, loss_token_counts(batch["response_mask"], agg, policy_loss=name))
    accumulated = loss_and_grad(name, agg, batch, pieces, shares)
    assert accumulated[0] == pytest.approx(whole[0], abs=1e-12)
    torch.testing.assert_close(accumulated[1], whole[1], atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["geo_mean", "sapo"])
def test_geo_mean_and_sapo_weigh_by_rows_under_token_mean(name):
    batch = mini_batch()
    assert loss_token_counts(batch["response_mask"], "token-mean", policy_loss=name) is None  # row shares
    rows = torch.arange(6)
    pieces = split_by_rows(rows, 4)
    whole = loss_and_grad(name, "token-mean", batch, [rows], [1.0])
    by_tokens = micro_batch_shares(pieces, batch["response_mask"].sum(-1))  # [19/27, 8/27]: the old weights
    wrong = loss_and_grad(name, "token-mean", batch, pieces, by_tokens)
    assert abs(wrong[0] - whole[0]) > 1e-3  # a row mean weighed by tokens is not the whole batch's loss


def test_token_mean_counts_tokens_and_the_seq_modes_count_rows():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert loss_token_counts(mask, "token-mean").tolist() == [3, 1]
    assert loss_token_counts(mask, "token-mean", policy_loss="vanilla").tolist() == [3, 1]
    assert loss_token_counts(mask, "seq-mean-token-mean", policy_loss="vanilla") is None
    assert sorted(name for name in POLICY_LOSSES if policy_loss_averages_rows(name)) == ["geo_mean", "sapo"]
