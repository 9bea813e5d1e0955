"""Advantage estimators and their registry, checked against hand-computed numbers."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from rlhfctl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    gae_advantages,
    get_advantage_estimator,
    grpo_advantages,
    register_advantage_estimator,
    reinforce_pp_advantages,
    remax_advantages,
    rloo_advantages,
)
from rlhfctl.algorithms import registry as registry_module

T = torch.tensor


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    want = torch.tensor(expected, dtype=actual.dtype)
    assert actual.shape == want.shape, (tuple(actual.shape), tuple(want.shape))
    assert torch.allclose(actual.detach(), want, atol=atol, rtol=0), f"{actual.tolist()} != {want.tolist()}"


def _whiten_list(xs: list[float]) -> list[float]:
    mean = statistics.mean(xs)
    std = math.sqrt(statistics.variance(xs) + 1e-8)  # unbiased, as masked_whiten
    return [(x - mean) / std for x in xs]


def _gae_reference(rewards, values, mask, gamma, lam):
    """verl's recursion written with plain python floats, one row at a time."""
    out_adv, out_ret = [], []
    for r_row, v_row, m_row in zip(rewards, values, mask):
        next_value, last = 0.0, 0.0
        adv = [0.0] * len(r_row)
        for t in reversed(range(len(r_row))):
            delta = r_row[t] + gamma * next_value - v_row[t]
            new = delta + gamma * lam * last
            if m_row[t]:
                next_value, last = v_row[t], new
            adv[t] = last
        out_adv.append(adv)
        out_ret.append([a + v for a, v in zip(adv, v_row)])
    return out_adv, out_ret


# ---------------------------------------------------------------------------------------- GAE


def test_gae_hand_example_gamma_lam_one():
    rewards = T([[0.0, 0.0, 1.0]])
    values = T([[0.5, 0.2, 0.1]])
    mask = T([[1, 1, 1]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    # deltas: t2 = 1 - 0.1 = 0.9; t1 = 0.1 - 0.2 = -0.1; t0 = 0.2 - 0.5 = -0.3
    raw = [0.5, 0.8, 0.9]
    close(ret, [[1.0, 1.0, 1.0]])
    close(adv, [_whiten_list(raw)], atol=1e-5)
    close(adv, [[-1.120897, 0.320256, 0.800641]], atol=1e-5)


def test_gae_masked_hole_carries_value_and_gae_through():
    rewards = T([[1.0, 0.0, 2.0]])
    values = T([[0.5, 9.0, 1.0]])
    mask = T([[1, 0, 1]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.5, lam=0.5)
    # t2: delta = 2 - 1 = 1, gae = 1; t1 masked: carries (next_value=1, gae=1);
    # t0: delta = 1 + 0.5*1 - 0.5 = 1, gae = 1 + 0.25*1 = 1.25
    close(ret, [[1.75, 10.0, 2.0]])  # carry 1.0 + V 9.0 at the hole
    # whitened over the valid [1.25, 1.0]: mean 1.125, unbiased std 0.1767767
    close(adv, [[0.7071068, 0.0, -0.7071068]], atol=1e-5)


def test_gae_matches_python_reference_on_random_batch():
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(4, 7, generator=g)
    values = torch.randn(4, 7, generator=g)
    mask = T([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0], [1, 0, 1, 1, 0, 1, 0], [0, 1, 1, 1, 1, 1, 1]])
    rewards = rewards * mask
    gamma, lam = 0.9, 0.8
    adv, ret = gae_advantages(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = _gae_reference(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    close(ret, ref_ret, atol=1e-5)
    flat_valid = [a for row, mrow in zip(ref_adv, mask.tolist()) for a, m in zip(row, mrow) if m]
    whitened = iter(_whiten_list(flat_valid))
    expected = [[next(whitened) if m else 0.0 for m in mrow] for mrow in mask.tolist()]
    close(adv, expected, atol=1e-4)


# --------------------------------------------------------------------------- GRPO and RLOO

# rows: a, b, a, c, a, c  -> group a scores [1, 0, 2], b [5] (group of one), c [3, 3] (std 0)
_GROUP_SCORES = [1.0, 5.0, 0.0, 3.0, 2.0, 3.0]
_GROUP_IDS = ["a", "b", "a", "c", "a", "c"]
_GROUP_MASK = T([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]])


def _outcome_rewards() -> torch.Tensor:
    """Each row's score placed on its last valid token."""
    rewards = torch.zeros(6, 3)
    for i, (score, row) in enumerate(zip(_GROUP_SCORES, _GROUP_MASK.tolist())):
        rewards[i, sum(row) - 1] = score
    return rewards


def _broadcast(per_row: list[float]) -> list[list[float]]:
    return [[a * m for m in row] for a, row in zip(per_row, _GROUP_MASK.tolist())]


@pytest.mark.parametrize(
    "index",
    [
        _GROUP_IDS,
        np.array(_GROUP_IDS, dtype=object),
        np.array([10, 20, 10, 30, 10, 30]),
        T([10, 20, 10, 30, 10, 30]),
    ],
    ids=["list", "object-array", "int-array", "tensor"],
)
def test_grpo_groups_normalised_by_std(index):
    adv, ret = grpo_advantages(_outcome_rewards(), _GROUP_MASK, index)
    eps = 1e-6
    # group a: mean 1, unbiased std sqrt((0 + 1 + 1) / 2) = 1; b: mean 0, std 1; c: std 0
    per_row = [0.0, 5.0 / (1 + eps), -1.0 / (1 + eps), 0.0, 1.0 / (1 + eps), 0.0]
    close(adv, _broadcast(per_row))
    assert torch.equal(adv, ret)
    assert adv.shape == (6, 3)


def test_grpo_without_std_is_dr_grpo_and_group_of_one_keeps_score():
    adv, _ = grpo_advantages(_outcome_rewards(), _GROUP_MASK, _GROUP_IDS, norm_by_std=False)
    per_row = [0.0, 5.0, -1.0, 0.0, 1.0, 0.0]
    close(adv, _broadcast(per_row))


def test_grpo_epsilon_used_in_denominator():
    rewards = T([[1.0], [3.0]])
    adv, _ = grpo_advantages(rewards, T([[1], [1]]), [0, 0], epsilon=1.0)
    # mean 2, unbiased std sqrt(2); denominator sqrt(2) + 1
    close(adv, [[-1 / (math.sqrt(2) + 1)], [1 / (math.sqrt(2) + 1)]])


def test_rloo_leave_one_out_baseline_and_group_of_one():
    adv, ret = rloo_advantages(_outcome_rewards(), _GROUP_MASK, _GROUP_IDS)
    # a: 1 - (0+2)/2 = 0, 0 - (1+2)/2 = -1.5, 2 - (1+0)/2 = 1.5; b alone: raw score 5; c: 3 - 3 = 0
    per_row = [0.0, 5.0, -1.5, 0.0, 1.5, 0.0]
    close(adv, _broadcast(per_row))
    assert torch.equal(adv, ret)


def test_group_index_length_mismatch_raises():
    with pytest.raises(ValueError, match="group ids"):
        grpo_advantages(_outcome_rewards(), _GROUP_MASK, ["a", "b"])


# ------------------------------------------------------------------------------ REINFORCE++


def test_reinforce_pp_discounted_returns_whitened():
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    adv, ret = reinforce_pp_advantages(rewards, mask, gamma=0.5)
    # row0: G2 = 1, G1 = 0.5, G0 = 0.25; row1: G2 = 0 (pad), G1 = 2, G0 = 1
    close(ret, [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]])
    w = _whiten_list([0.25, 0.5, 1.0, 1.0, 2.0])
    close(adv, [w[:3], [w[3], w[4], 0.0]], atol=1e-5)


def test_reinforce_pp_running_return_resets_after_masked_token():
    rewards = T([[1.0, 5.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    mask = T([[1, 0, 1, 1], [1, 1, 1, 1]])
    _, ret = reinforce_pp_advantages(rewards, mask, gamma=1.0)
    # row0 backwards: t3 = 0, t2 = 2, t1 = 5 + 2 = 7 then reset, t0 = 1 + 0 = 1
    assert ret.tolist() == [[1.0, 7.0, 2.0, 0.0], [4.0, 3.0, 2.0, 1.0]]


# ------------------------------------------------------------------------------------ ReMax


def test_remax_reverse_cumsum_minus_baseline():
    rewards = T([[0.0, 1.0, 2.0], [1.0, 0.0, 3.0]])
    mask = T([[1, 1, 0], [1, 1, 1]])
    baselines = T([0.5, 1.0])
    adv, ret = remax_advantages(rewards, baselines, mask)
    # row0 masked rewards [0, 1, 0] -> returns [1, 1, 0]; row1 -> [4, 3, 3]
    assert ret.tolist() == [[1.0, 1.0, 0.0], [4.0, 3.0, 3.0]]
    assert adv.tolist() == [[0.5, 0.5, 0.0], [3.0, 2.0, 2.0]]


# ------------------------------------------------------------------ shapes and masked zeros


def test_all_estimators_shapes_and_zero_advantage_on_padding():
    g = torch.Generator().manual_seed(1)
    mask = T([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    rewards = torch.randn(4, 5, generator=g) * mask
    values = torch.randn(4, 5, generator=g)
    common = dict(token_level_rewards=rewards, response_mask=mask, values=values,
                  index=["p", "p", "q", "q"], reward_baselines=torch.randn(4, generator=g), gamma=0.99, lam=0.95)
    for name in ["gae", "grpo", "rloo", "reinforce_plus_plus", "remax"]:
        adv, ret = compute_advantages(name, **common)
        assert adv.shape == ret.shape == (4, 5), name
        assert not adv.requires_grad
        assert torch.all(adv[mask == 0] == 0), name
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), name


# --------------------------------------------------------------------------------- registry


def test_builtin_names_registered():
    assert set(ADVANTAGE_ESTIMATORS) >= {"gae", "grpo", "rloo", "reinforce_plus_plus", "remax"}
    assert get_advantage_estimator("gae") is gae_advantages
    assert get_advantage_estimator("reinforce_plus_plus") is reinforce_pp_advantages


def test_unknown_estimator_lists_choices():
    with pytest.raises(ValueError) as err:
        get_advantage_estimator("x")
    msg = str(err.value)
    assert msg.startswith("unknown advantage estimator 'x'; choose one of: ")
    for name in ["gae", "grpo", "rloo", "reinforce_plus_plus", "remax"]:
        assert name in msg
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_advantages("x", token_level_rewards=T([[1.0]]), response_mask=T([[1]]))


@pytest.mark.parametrize(
    ("name", "missing"),
    [("gae", "needs values: configure a critic role"), ("grpo", "needs index"), ("rloo", "needs index"),
     ("remax", "needs reward_baselines")],
)
def test_compute_advantages_missing_input(name, missing):
    with pytest.raises(ValueError) as err:
        compute_advantages(name, token_level_rewards=T([[1.0, 0.0]]), response_mask=T([[1, 1]]))
    assert str(err.value).startswith(f"advantage estimator {name!r} {missing}")


def test_compute_advantages_passes_only_declared_inputs():
    rewards = T([[0.0, 1.0], [0.0, 3.0]])
    mask = T([[1, 1], [1, 1]])
    adv, _ = compute_advantages("grpo", token_level_rewards=rewards, response_mask=mask, index=[0, 0],
                                values=torch.zeros(2, 2), gamma=0.5, norm_by_std=False)
    assert adv.tolist() == [[-1.0, -1.0], [1.0, 1.0]]
    direct = gae_advantages(rewards, torch.ones(2, 2), mask, 0.9, 0.8)
    via = compute_advantages("gae", token_level_rewards=rewards, response_mask=mask, values=torch.ones(2, 2),
                             gamma=0.9, lam=0.8, index=[0, 1])
    assert torch.equal(direct[0], via[0]) and torch.equal(direct[1], via[1])


def test_register_custom_estimator_and_conflicts():
    name = "test_custom_sign"
    try:
        @register_advantage_estimator(name)
        def sign_estimator(token_level_rewards, response_mask, scale=1.0):
            adv = torch.sign(token_level_rewards.sum(-1, keepdim=True)) * response_mask * scale
            return adv, adv

        assert name in ADVANTAGE_ESTIMATORS
        adv, _ = compute_advantages(name, token_level_rewards=T([[0.0, -2.0]]), response_mask=T([[1, 0]]),
                                    scale=3.0)
        assert adv.tolist() == [[-3.0, 0.0]]
        # the same function again is fine (module re-import); a different one is not
        register_advantage_estimator(name)(sign_estimator)
        with pytest.raises(ValueError, match="already registered"):
            register_advantage_estimator(name)(lambda token_level_rewards, response_mask: (None, None))
    finally:
        registry_module._REGISTRY.pop(name, None)
    assert name not in ADVANTAGE_ESTIMATORS
