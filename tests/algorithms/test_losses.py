"""PPO policy and value losses, loss aggregation, entropy and masked statistics."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfctl.algorithms import (
    agg_loss,
    entropy_from_logits,
    explained_variance,
    masked_mean,
    masked_var,
    masked_whiten,
    ppo_policy_loss,
    value_loss,
)

T = torch.tensor


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    want = torch.tensor(expected, dtype=actual.dtype)
    assert actual.shape == want.shape, (tuple(actual.shape), tuple(want.shape))
    assert torch.allclose(actual.detach(), want, atol=atol, rtol=0), f"{actual.tolist()} != {want.tolist()}"


# -------------------------------------------------------------------------------- agg_loss

LOSS = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])


@pytest.mark.parametrize(
    ("agg", "expected"),
    [("token-mean", 7 / 3), ("seq-mean-token-sum", (3 + 4) / 2), ("seq-mean-token-mean", (1.5 + 4) / 2)],
)
def test_agg_loss_modes(agg, expected):
    assert agg_loss(LOSS, T([[1, 1, 0], [1, 0, 0]]), agg).item() == pytest.approx(expected)


@pytest.mark.parametrize(
    ("agg", "expected"),
    [("token-mean", 1.5), ("seq-mean-token-sum", 3 / 2), ("seq-mean-token-mean", 1.5 / 2)],
)
def test_agg_loss_row_without_tokens_contributes_zero(agg, expected):
    assert agg_loss(LOSS, T([[1, 1, 0], [0, 0, 0]]), agg).item() == pytest.approx(expected)


def test_agg_loss_empty_mask_is_zero_and_unknown_mode_lists_choices():
    for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        assert agg_loss(LOSS, torch.zeros(2, 3), agg).item() == 0.0
    with pytest.raises(ValueError) as err:
        agg_loss(LOSS, torch.ones(2, 3), "seq-sum")
    for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        assert agg in str(err.value)


# ------------------------------------------------------------------------- ppo_policy_loss

# Five tokens, old log-prob 0, clip_low 0.2, clip_high 0.28, dual clip c = 3:
#   a: A= 1, ratio 1.5 -> max(-1.5, -1.28) = -1.28   clipped branch won
#   b: A= 1, ratio 0.5 -> max(-0.5, -0.8)  = -0.5
#   c: A=-1, ratio 5.0 -> max(5, 1.28) = 5 -> min(5, 3) = 3   dual clip active
#   d: A=-1, ratio 0.5 -> max(0.5, 0.8) = 0.8         clipped branch won
#   e: masked out
RATIOS = [1.5, 0.5, 5.0, 0.5, 1.1]
ADV = T([[1.0, 1.0, -1.0, -1.0, 2.0]])
MASK = T([[1, 1, 1, 1, 0]])


def _log_prob(requires_grad: bool = False) -> torch.Tensor:
    return T([[math.log(r) for r in RATIOS]], requires_grad=requires_grad)


def test_ppo_policy_loss_hand_example_with_dual_clip():
    log_prob = _log_prob(requires_grad=True)
    loss, metrics = ppo_policy_loss(torch.zeros(1, 5), log_prob, ADV, MASK, 0.2, 0.28, 3.0, "token-mean")
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 3.0 + 0.8) / 4, abs=1e-6)
    assert metrics["clipfrac"].item() == pytest.approx(2 / 4)
    assert metrics["clipfrac_lower"].item() == pytest.approx(1 / 4)
    valid = RATIOS[:4]
    assert metrics["approx_kl"].item() == pytest.approx(sum((r - 1) - math.log(r) for r in valid) / 4, abs=1e-6)
    assert metrics["ppo_kl"].item() == pytest.approx(sum(-math.log(r) for r in valid) / 4, abs=1e-6)
    assert all(not v.requires_grad for v in metrics.values())
    loss.backward()
    # only token b is on the unclipped branch: d(-A * ratio)/d log_prob = -A * ratio = -0.5, / 4 tokens
    close(log_prob.grad, [[0.0, -0.125, 0.0, 0.0, 0.0]])


def test_ppo_policy_loss_without_dual_clip_and_other_aggregations():
    loss, metrics = ppo_policy_loss(torch.zeros(1, 5), _log_prob(), ADV, MASK, 0.2, 0.28, None, "token-mean")
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 5.0 + 0.8) / 4, abs=1e-6)
    assert metrics["clipfrac_lower"].item() == 0.0
    loss, _ = ppo_policy_loss(torch.zeros(1, 5), _log_prob(), ADV, MASK, 0.2, 0.28, 3.0, "seq-mean-token-sum")
    assert loss.item() == pytest.approx(-1.28 - 0.5 + 3.0 + 0.8, abs=1e-6)


def test_ppo_policy_loss_symmetric_clip_and_identity_ratio():
    adv = T([[0.3, -0.7, 1.2]])
    mask = torch.ones(1, 3)
    same = T([[-0.5, -1.0, -2.0]])
    loss, metrics = ppo_policy_loss(same, same.clone(), adv, mask, 0.2, 0.2, 3.0, "token-mean")
    assert loss.item() == pytest.approx(-(0.3 - 0.7 + 1.2) / 3, abs=1e-6)  # ratio 1: -mean(A)
    assert metrics["clipfrac"].item() == 0.0
    assert metrics["approx_kl"].item() == 0.0


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_ppo_policy_loss_rejects_dual_clip_not_above_one(c):
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_policy_loss(torch.zeros(1, 5), _log_prob(), ADV, MASK, 0.2, 0.2, c, "token-mean")


# ------------------------------------------------------------------------------ value_loss


def test_value_loss_clipped_hand_example():
    values = T([[1.0, 1.0, -1.0, 100.0]], requires_grad=True)
    old = T([[0.0, 0.8, 0.0, 0.0]])
    returns = T([[2.0, 0.0, -1.0, 0.0]])
    mask = T([[1, 1, 1, 0]])
    loss, metrics = value_loss(values, old, returns, mask, 0.5, "token-mean")
    # t0: clip 1 -> 0.5: max((1-2)^2, (0.5-2)^2) = 2.25 (clipped won)
    # t1: 1 within [0.3, 1.3]: both 1.0 (tie: not counted as clipped)
    # t2: clip -1 -> -0.5: max(0, 0.25) = 0.25 (clipped won)
    assert loss.item() == pytest.approx(0.5 * (2.25 + 1.0 + 0.25) / 3, abs=1e-6)
    assert metrics["vf_clipfrac"].item() == pytest.approx(2 / 3)
    loss.backward()
    # only t1 has a gradient: 0.5 * 2 * (1 - 0) / 3
    close(values.grad, [[0.0, 1 / 3, 0.0, 0.0]])


def test_value_loss_unclipped():
    values = T([[1.0, 3.0]])
    loss, metrics = value_loss(values, torch.zeros(1, 2), T([[0.0, 1.0]]), torch.ones(1, 2), None, "token-mean")
    assert loss.item() == pytest.approx(0.5 * (1 + 4) / 2)
    assert metrics["vf_clipfrac"].item() == 0.0


# --------------------------------------------------------------------------------- entropy


def test_entropy_from_logits():
    logits = T([[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), 0.0, 0.0]])[:, :4]
    logits[1, 2:] = -50.0  # ~ p = [0.25, 0.75, 0, 0]
    h = entropy_from_logits(logits)
    assert h.shape == (2,)
    assert h[0].item() == pytest.approx(math.log(4.0), abs=1e-6)
    assert h[1].item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    assert entropy_from_logits(torch.zeros(2, 3, 5)).shape == (2, 3)


# ---------------------------------------------------------------------- masked statistics

X = T([[1.0, 2.0, 100.0], [3.0, 4.0, -100.0]])
XMASK = T([[1, 1, 0], [1, 1, 0]])


def test_masked_mean_and_var():
    assert masked_mean(X, XMASK).item() == pytest.approx(2.5)
    close(masked_mean(X, XMASK, dim=-1), [1.5, 3.5])
    close(masked_mean(X, XMASK.bool(), dim=0), [2.0, 3.0, 0.0])  # empty column -> 0
    assert masked_var(X, XMASK).item() == pytest.approx(5 / 3)  # (2.25+0.25+0.25+2.25)/3
    assert masked_var(X, XMASK, unbiased=False).item() == pytest.approx(5 / 4)
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(X, T([[1, 0, 0], [0, 0, 0]]))


def test_masked_whiten():
    std = math.sqrt(5 / 3 + 1e-8)
    w = masked_whiten(X, XMASK)
    close(w[:, :2], [[(1 - 2.5) / std, (2 - 2.5) / std], [(3 - 2.5) / std, (4 - 2.5) / std]], atol=1e-5)
    w2 = masked_whiten(X, XMASK, shift_mean=False)
    close(w2[:, :2], [[(1 - 2.5) / std + 2.5, (2 - 2.5) / std + 2.5], [(3 - 2.5) / std + 2.5, (4 - 2.5) / std + 2.5]],
          atol=1e-5)


def test_explained_variance():
    returns = T([[1.0, 2.0, 3.0, 4.0, 99.0]])
    mask = T([[1, 1, 1, 1, 0]])
    assert explained_variance(returns.clone(), returns, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask).item() == pytest.approx(0.0)
    # residual [0, 0, 0, -1]: biased var 0.1875; var(returns) 1.25 -> 1 - 0.15
    values = T([[1.0, 2.0, 3.0, 5.0, -7.0]])
    assert explained_variance(values, returns, mask).item() == pytest.approx(0.85, abs=1e-6)
    assert math.isnan(explained_variance(values, torch.ones_like(returns), mask).item())


def test_truncated_importance_weights_cap_the_ratio_and_scale_each_token_loss():
    from rlhfctl.algorithms import truncated_importance_weights

    old = torch.tensor([[-1.0, -2.0, -0.5]])
    engine = torch.tensor([[-1.0, -1.0, -2.5]])  # ratios exp(0), exp(-1), exp(2)
    weights = truncated_importance_weights(old, engine, cap=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, math.exp(-1.0), 2.0]]))
    with pytest.raises(ValueError, match="> 0"):
        truncated_importance_weights(old, engine, cap=0.0)
    advantages, mask = torch.tensor([[1.0, -1.0, 2.0]]), torch.ones(1, 3)
    plain, _ = ppo_policy_loss(old, old, advantages, mask, 0.2, 0.2, None, "seq-mean-token-sum")
    weighted, _ = ppo_policy_loss(old, old, advantages, mask, 0.2, 0.2, None, "seq-mean-token-sum", token_weights=weights)
    # at ratio 1 each token's loss is -A: the weighted sum is -(1 * 1 - 1 * e^-1 + 2 * 2)
    assert plain.item() == pytest.approx(-2.0)
    assert weighted.item() == pytest.approx(-(1.0 - math.exp(-1.0) + 4.0))
