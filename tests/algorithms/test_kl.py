"""KL estimators, the in-reward KL penalty and the KL coefficient controllers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlhfctl.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    build_kl_controller,
    kl_penalty,
)

T = torch.tensor

LOGP = T([-1.0, -2.0, -0.3])
REF = T([-1.5, -1.0, -0.3])
# x = logp - ref = [0.5, -1.0, 0.0]; d = ref - logp = [-0.5, 1.0, 0.0]
EXPECTED = {
    "k1": [0.5, -1.0, 0.0],
    "k2": [0.125, 0.5, 0.0],
    "k3": [math.exp(-0.5) + 0.5 - 1.0, math.exp(1.0) - 1.0 - 1.0, 0.0],  # [0.1065307, 0.7182818, 0]
    "abs": [0.5, 1.0, 0.0],
}


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    want = torch.tensor(expected, dtype=actual.dtype)
    assert actual.shape == want.shape, (tuple(actual.shape), tuple(want.shape))
    assert torch.allclose(actual.detach(), want, atol=atol, rtol=0), f"{actual.tolist()} != {want.tolist()}"


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "abs"])
def test_kl_kinds_values(kind):
    close(kl_penalty(LOGP, REF, kind), EXPECTED[kind])


@pytest.mark.parametrize(("alias", "kind"), [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")])
def test_kl_aliases(alias, kind):
    assert torch.equal(kl_penalty(LOGP, REF, alias), kl_penalty(LOGP, REF, kind))


def test_kl_unknown_kind_lists_choices():
    with pytest.raises(ValueError) as err:
        kl_penalty(LOGP, REF, "k4")
    msg = str(err.value)
    assert "'k4'" in msg
    for kind in ["k1", "k2", "k3", "abs"]:
        assert kind in msg


def test_k3_is_clamped_and_has_finite_gradient():
    logp = T([0.0, 30.0, 0.0], requires_grad=True)
    ref = T([30.0, 0.0, 0.5])
    kl = kl_penalty(logp, ref, "k3")
    # d = 30 -> exp(30) - 31 -> 10; d = -30 -> exp(-20) + 19 (inner clamp) -> 10
    close(kl.detach(), [10.0, 10.0, math.exp(0.5) - 0.5 - 1.0])
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[:2].tolist() == [0.0, 0.0]  # clamped: no gradient
    assert logp.grad[2].item() == pytest.approx(-(math.exp(0.5) - 1.0), abs=1e-6)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-15, 0), min_size=1, max_size=8),
    st.lists(st.floats(-15, 0), min_size=1, max_size=8),
)
@example(logp=[-5.960464477539063e-08], ref=[0.0])  # float32 rounding made k3 -6e-8 before the clamp at 0
def test_k2_k3_abs_are_non_negative(logp, ref):
    n = min(len(logp), len(ref))
    lp, rf = T(logp[:n]), T(ref[:n])
    for kind in ("k2", "k3", "abs"):
        assert (kl_penalty(lp, rf, kind) >= 0).all(), kind


def test_apply_kl_penalty_hand_example():
    scores = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    logp = T([[-1.0, -1.0, -1.0], [-2.0, -2.0, -9.0]])
    ref = T([[-1.5, -1.0, -0.5], [-1.0, -2.0, 0.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    rewards, current_kl = apply_kl_penalty(scores, logp, ref, mask, coef=0.1, kind="k1")
    # k1 = [[0.5, 0, -0.5], [-1, 0, (masked)]]
    close(rewards, [[-0.05, 0.0, 1.05], [0.1, 2.0, 0.0]])
    # per-row token means: 0/3 = 0 and -1/2 = -0.5 -> batch mean -0.25
    assert current_kl.item() == pytest.approx(-0.25)


def test_adaptive_kl_controller_update_math():
    ctl = AdaptiveKLController(init_coef=0.1, target=6.0, horizon=10000)
    ctl.update(current_kl=9.0, n_steps=256)  # error 0.5 clipped to 0.2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000))
    v = ctl.value
    ctl.update(current_kl=3.0, n_steps=256)  # error -0.5 clipped to -0.2
    assert ctl.value == pytest.approx(v * (1 - 0.2 * 256 / 10000))
    v = ctl.value
    ctl.update(current_kl=6.6, n_steps=100)  # error 0.1, inside the clip
    assert ctl.value == pytest.approx(v * (1 + 0.1 * 100 / 10000))
    v = ctl.value
    ctl.update(current_kl=6.0, n_steps=100)  # on target: unchanged
    assert ctl.value == pytest.approx(v)


def test_adaptive_kl_controller_state_round_trip():
    a = AdaptiveKLController(init_coef=0.2, target=3.0, horizon=500)
    a.update(1.0, 64)
    state = a.state_dict()
    b = AdaptiveKLController(init_coef=1.0, target=1.0, horizon=1)
    b.load_state_dict(state)
    assert (b.value, b.target, b.horizon) == (a.value, a.target, a.horizon)
    a.update(5.0, 32)
    b.update(5.0, 32)
    assert a.value == b.value


def test_fixed_kl_controller():
    ctl = FixedKLController(coef=0.05)
    ctl.update(current_kl=100.0, n_steps=1000)
    assert ctl.value == 0.05
    other = FixedKLController(coef=1.0)
    other.load_state_dict(ctl.state_dict())
    assert other.value == 0.05


def test_controller_validation_and_factory():
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target=0.0, horizon=10)
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target=1.0, horizon=0)
    assert isinstance(build_kl_controller("fixed", 0.1), FixedKLController)
    ada = build_kl_controller("adaptive", 0.1, target=6.0, horizon=10000)
    assert isinstance(ada, AdaptiveKLController) and ada.target == 6.0
    with pytest.raises(ValueError, match="target"):
        build_kl_controller("adaptive", 0.1)
    with pytest.raises(ValueError, match="fixed, adaptive"):
        build_kl_controller("pid", 0.1)
