"""The registered policy losses against verl 0.9's functions of the same name (fixtures/make_verl_policy_losses.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rlhfctl.algorithms import POLICY_LOSSES, agg_loss, get_policy_loss

_FIXTURE = torch.load(Path(__file__).parent / "fixtures" / "verl_policy_losses.pt", weights_only=True)
_CASES = _FIXTURE["cases"]


def test_every_builtin_loss_is_registered():
    assert {"vanilla", "gspo", "cispo", "gpg", "clip_cov", "kl_cov", "geo_mean", "sapo"} <= set(POLICY_LOSSES)


def test_unknown_loss_lists_the_registered_names():
    with pytest.raises(ValueError, match="unknown policy loss 'nope'; choose one of: .*vanilla"):
        get_policy_loss("nope")


@pytest.mark.parametrize("case", _CASES, ids=[f"{c['loss_name']}-{c['agg']}-{c['seed']}" for c in _CASES])
def test_loss_metrics_and_gradient_equal_verl(case):
    log_prob = case["log_prob"].clone().requires_grad_(True)
    torch.manual_seed(case["seed"])
    loss, metrics = get_policy_loss(case["loss_name"])(
        case["old_log_prob"], log_prob, case["advantages"], case["response_mask"], case["agg"], case["settings"]
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    assert loss.item() == pytest.approx(case["loss"].item(), abs=1e-6)
    assert torch.allclose(grad, case["grad"], atol=1e-6, rtol=0)
    assert set(metrics) == set(case["metrics"])
    for key, value in case["metrics"].items():
        assert metrics[key].item() == pytest.approx(value, abs=1e-6), key


def test_seq_mean_token_sum_norm_divides_by_the_constant():
    # rows sum to 1+2=3 and 4 -> mean 3.5, / 10 = 0.35; without a constant, / width 3 = 1.1666...
    loss_mat = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert agg_loss(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=10).item() == pytest.approx(0.35)
    assert agg_loss(loss_mat, mask, "seq-mean-token-sum-norm").item() == pytest.approx(3.5 / 3)


# Hand-computed examples: one row, every token valid, token-mean unless said; clip 0.2 below, 0.28 above.
_SETTINGS = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
LN2 = math.log(2.0)


def _run(name, old, new, adv, agg="token-mean", **settings):
    t = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    return get_policy_loss(name)(t(old), t(new), t(adv), torch.ones(1, len(old)), agg, {**_SETTINGS, **settings})


def test_vanilla_by_hand():
    # ratio [2, 1], A = 1: max(-2, -1.28) = -1.28 and max(-1, -1) = -1; mean -1.14; the clip won on token 1 of 2
    loss, metrics = _run("vanilla", [0, 0], [LN2, 0], [1, 1])
    assert loss.item() == pytest.approx(-1.14) and metrics["pg_clipfrac"].item() == pytest.approx(0.5)


def test_gspo_by_hand():
    # sequence ratio exp((ln2 + 0)/2) = sqrt(2) = 1.414 > 1.28: both tokens -1.28
    loss, metrics = _run("gspo", [0, 0], [LN2, 0], [1, 1])
    assert loss.item() == pytest.approx(-1.28) and metrics["pg_clipfrac"].item() == pytest.approx(1.0)


def test_cispo_by_hand():
    # weights sg[clip([2, 1])] = [1.28, 1]; loss mean(-1.28 * 1 * ln2, -1 * 1 * 0) = -0.64 ln2 = -0.443614
    loss, metrics = _run("cispo", [0, 0], [LN2, 0], [1, 1])
    assert loss.item() == pytest.approx(-0.64 * LN2) and metrics["pg_clipfrac"].item() == pytest.approx(0.5)


def test_gpg_by_hand():
    # -A log pi = [-(1 * -1), -(2 * -2)] = [1, 4]; mean 2.5
    loss, metrics = _run("gpg", [0, 0], [-1, -2], [1, 2])
    assert loss.item() == pytest.approx(2.5) and metrics == {}


def test_clip_cov_by_hand():
    # ratio 1 (no clip). A = [2, 1, -2], mean 1/3; log pi = [-1, -2, -3], mean -2;
    # cov = [5/3 * 1, 2/3 * 0, -7/3 * -1] = [1.667, 0, 2.333]: tokens 0 and 2 lie in (1.5, 3), ratio 1.0 drops both;
    # losses -A * 1 = [-2, -1, 2] -> [0, -1, 0]; mean -1/3; 2 of 3 dropped
    loss, metrics = _run("clip_cov", [-1, -2, -3], [-1, -2, -3], [2, 1, -2], clip_cov_ratio=1.0, clip_cov_lb=1.5, clip_cov_ub=3.0)
    assert loss.item() == pytest.approx(-1 / 3) and metrics["pg_clipfrac"].item() == pytest.approx(2 / 3)


def test_kl_cov_by_hand():
    # A = [1, 0, -1] (mean 0), log pi = [ln2, 0, 0] (mean ln2/3): cov = [2 ln2/3, 0, ln2/3]; top max(1, int(3 * 0.2)) = 1
    # is token 0. -A * ratio = [-2, 0, 1]; token 0 adds 0.5 * |ln2|: (-2 + 0.5 ln2 + 0 + 1) / 3 = -0.217810
    loss, metrics = _run("kl_cov", [0, 0, 0], [LN2, 0, 0], [1, 0, -1], kl_cov_ratio=0.2, ppo_kl_coef=0.5)
    assert loss.item() == pytest.approx((-1 + 0.5 * LN2) / 3) and metrics["ppo_kl"].item() == pytest.approx(LN2 / 3)


def test_geo_mean_by_hand():
    # A > 0: min(d, clamp(d, -0.2, 0.28)) = [0.28, 0]; ratio exp(0.28 / 2) = 1.150274; token-mean A = 1; loss -1.150274
    loss, metrics = _run("geo_mean", [0, 0], [LN2, 0], [1, 1])
    assert loss.item() == pytest.approx(-math.exp(0.14)) and metrics["pg_clipfrac"].item() == pytest.approx(0.5)


def test_sapo_by_hand():
    # ratio 1, so the gate is sigmoid(0) * 4 / tau = 2 / tau: A = 1 -> -2 (tau_pos 1); A = -1 -> +2 / 1.05 = 1.904762
    # (tau_neg 1.05); seq-mean-token-mean of the row: (-2 + 1.904762) / 2 = -0.047619, whatever loss_agg_mode says
    loss, _ = _run("sapo", [0, 0], [0, 0], [1, -1], agg="token-mean")
    assert loss.item() == pytest.approx((-2 + 2 / 1.05) / 2)
