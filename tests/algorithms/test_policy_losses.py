"""The registered policy losses against verl 0.9's functions of the same name (fixtures/make_verl_policy_losses.py)."""

from __future__ import annotations

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
