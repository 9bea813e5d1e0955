"""grpo_passk, opo, gpg and gdpo: equal to verl 0.9's functions (fixtures/make_verl_estimators.py), one
hand-computed example each, their error messages, and gdpo's named rewards through the registry."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlhfctl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    gdpo_advantages,
    gpg_advantages,
    grpo_passk_advantages,
    opo_advantages,
)

T = torch.tensor
_FIXTURE = torch.load(Path(__file__).parent / "fixtures" / "verl_estimators.pt", weights_only=True)


def rewards_on_last_token(scores: list[float], mask: torch.Tensor) -> torch.Tensor:
    """A token-level reward: each score on its row's last valid token."""
    rewards = torch.zeros_like(mask)
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    rewards[torch.arange(len(scores)), last] = T(scores, dtype=mask.dtype)
    return rewards * mask


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    want = T(expected, dtype=actual.dtype)
    assert actual.shape == want.shape, (tuple(actual.shape), tuple(want.shape))
    assert torch.allclose(actual, want, atol=atol, rtol=0), f"{actual.tolist()} != {want.tolist()}"


def test_the_four_estimators_are_registered():
    assert {"grpo_passk", "opo", "gpg", "gdpo"} <= set(ADVANTAGE_ESTIMATORS)


# ------------------------------------------------------------------------------ equal to verl


def _case_id(case: dict) -> str:
    keys = "+".join(case.get("reward_keys") or []) if case["estimator"] == "gdpo" else ""
    return f"{case['estimator']}-{len(case['index'])}rows-{keys or 'sum'}-std{int(case['norm_by_std'])}"


@pytest.mark.parametrize("case", _FIXTURE["cases"], ids=_case_id)
def test_advantages_equal_verl(case):
    extra = {}
    if case["estimator"] == "gdpo":
        extra = {key: case[key] for key in ("named_scores", "reward_keys", "reward_weights")}
    advantages, returns = compute_advantages(
        case["estimator"], token_level_rewards=case["token_level_rewards"], response_mask=case["response_mask"],
        index=case["index"], norm_by_std=case["norm_by_std"], **extra,
    )
    assert advantages.dtype == case["verl"].dtype and advantages.shape == case["verl"].shape
    torch.testing.assert_close(advantages, case["verl"], atol=1e-6, rtol=0)
    assert torch.equal(advantages, returns)
    assert torch.all(advantages[case["response_mask"] == 0] == 0)


def test_the_fixture_covers_every_estimator_and_lone_groups():
    cases = _FIXTURE["cases"]
    assert {case["estimator"] for case in cases} == {"grpo_passk", "opo", "gpg", "gdpo"}
    lone = {case["estimator"] for case in cases if min(case["index"].count(g) for g in case["index"]) == 1}
    assert lone == {"opo", "gpg", "gdpo"}  # verl raises for grpo_passk
    assert {len(case["reward_keys"]) for case in cases if case["estimator"] == "gdpo"} == {0, 1, 2, 3}


# ------------------------------------------------------------------------------ by hand


def test_grpo_passk_credits_only_the_best_response_and_ties_give_zero():
    mask = T([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    rewards = rewards_on_last_token([1.0, 3.0, 2.0, 0.5, 0.5], mask)
    index = ["a", "a", "a", "b", "b"]
    adv, ret = grpo_passk_advantages(rewards, mask, index)
    # group a [1, 3, 2]: best row 1, gap 3 - 2 = 1; mean 2, unbiased var (1 + 1 + 0) / 2 = 1, std 1 -> 1 / (1 + 1e-6)
    # group b [0.5, 0.5]: the maximum is shared, gap 0.5 - 0.5 = 0 for both rows
    best = 1.0 / (1.0 + 1e-6)
    close(adv, [[0, 0], [best, 0], [0, 0], [0, 0], [0, 0]])
    assert torch.equal(adv, ret)
    adv, _ = grpo_passk_advantages(rewards, mask, index, norm_by_std=False)
    close(adv, [[0, 0], [1, 0], [0, 0], [0, 0], [0, 0]])  # the gap itself


def test_opo_baseline_is_the_length_weighted_group_mean():
    mask = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards = rewards_on_last_token([1.0, 0.0, 4.0, 2.0], mask)
    adv, ret = opo_advantages(rewards, mask, ["a", "a", "a", "b"])
    # group a: lengths [2, 1, 3], b = (2*1 + 1*0 + 3*4) / (2 + 1 + 3) = 14/6 = 7/3
    # A = [1 - 7/3, 0 - 7/3, 4 - 7/3] = [-4/3, -7/3, 5/3]; group b is alone: baseline 0, A = 2
    close(adv, [[-4 / 3, -4 / 3, 0], [-7 / 3, 0, 0], [5 / 3, 5 / 3, 5 / 3], [2, 2, 0]])
    assert torch.equal(adv, ret)


def test_gpg_rescales_by_batch_over_nonzero_scores_without_std():
    mask = T([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    rewards = rewards_on_last_token([1.0, 0.0, 0.0, 2.0, 4.0, 3.0], mask)
    adv, ret = gpg_advantages(rewards, mask, ["a", "a", "a", "b", "b", "c"])
    # B = 6 rows, M = 4 nonzero scores: alpha = 6/4 = 1.5
    # a [1, 0, 0], mean 1/3: 1.5 * [2/3, -1/3, -1/3] = [1, -0.5, -0.5]
    # b [2, 4], mean 3: 1.5 * [-1, 1] = [-1.5, 1.5] (not divided by b's std, sqrt(2))
    # c [3] alone, mean 0: 1.5 * 3 = 4.5
    close(adv, [[1, 1], [-0.5, -0.5], [-0.5, 0], [-1.5, -1.5], [1.5, 1.5], [4.5, 4.5]])
    assert torch.equal(adv, ret)


def test_gdpo_normalizes_each_named_reward_in_its_group_then_whitens_the_weighted_sum():
    mask = T([[1.0, 1.0, 0.0]] * 4)
    named = {"acc": T([1.0, 0.0, 1.0, 1.0]), "format": T([1.0, 1.0, 0.0, 1.0]), "unused": T([9.0] * 4)}
    rewards = torch.zeros(4, 3)
    index = ["a", "a", "b", "b"]
    adv, ret = gdpo_advantages(rewards, mask, index, named, ["acc", "format"], [1.0, 0.5], norm_by_std=False)
    # acc    a [1, 0] - 0.5 = [0.5, -0.5];  b [1, 1] - 1 = [0, 0]
    # format a [1, 1] - 1 = [0, 0];         b [0, 1] - 0.5 = [-0.5, 0.5]
    # 1 * acc + 0.5 * format = [0.5, -0.5, -0.25, 0.25], on 2 tokens per row (8 tokens)
    # mean 0, unbiased var 2 * (0.25 + 0.25 + 0.0625 + 0.0625) / 7 = 1.25/7, 1/std = sqrt(5.6) = 2.366432
    # [0.5, -0.5, -0.25, 0.25] * 2.366432 = [1.183216, -1.183216, -0.591608, 0.591608]; the padding column 0
    want = [[1.183216, 1.183216, 0], [-1.183216, -1.183216, 0], [-0.591608, -0.591608, 0], [0.591608, 0.591608, 0]]
    close(adv, want)
    assert torch.equal(adv, ret)
    # With the std (0.707107 in both groups that vary) every term grows by the same 1.414, which whitening removes
    adv, _ = gdpo_advantages(rewards, mask, index, named, ["acc", "format"], [1.0, 0.5])
    close(adv, want, atol=1e-5)


def test_gdpo_without_reward_keys_uses_the_token_level_rewards_as_the_single_reward():
    mask = T([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    scores = [1.0, 0.0, 2.0, 5.0]
    rewards = rewards_on_last_token(scores, mask)
    index = [0, 0, 1, 1]
    fallback, _ = gdpo_advantages(rewards, mask, index, {})
    named, _ = gdpo_advantages(rewards, mask, index, {"score": T(scores)}, ["score"])
    torch.testing.assert_close(fallback, named, atol=0, rtol=0)


# ------------------------------------------------------------------------------ errors


def test_grpo_passk_names_a_group_of_one_and_asks_for_rollout_n_2():
    mask = torch.ones(3, 2)
    with pytest.raises(ValueError, match=r"grpo_passk: group 'lonely' has a single response.*set rollout\.n >= 2"):
        grpo_passk_advantages(rewards_on_last_token([1.0, 2.0, 3.0], mask), mask, ["p", "p", "lonely"])


def test_gdpo_missing_key_lists_the_names_present_and_says_what_to_return():
    mask = torch.ones(2, 2)
    named = {"acc": T([1.0, 0.0]), "length": T([0.2, 0.1])}
    with pytest.raises(ValueError, match=r"reward key 'format' .* not among the named scores \(acc, length\); "
                                         r"the reward function must return 'format' in its dict"):
        gdpo_advantages(torch.zeros(2, 2), mask, [0, 0], named, ["acc", "format"])


def test_gdpo_weights_must_give_one_per_reward():
    mask = torch.ones(2, 2)
    named = {"acc": T([1.0, 0.0]), "format": T([0.0, 1.0])}
    with pytest.raises(ValueError, match=r"gdpo_reward_weights has 3 entries for 2 rewards .*one weight per key"):
        gdpo_advantages(torch.zeros(2, 2), mask, [0, 0], named, ["acc", "format"], [1.0, 2.0, 3.0])


def test_gdpo_named_score_of_the_wrong_length_is_an_error():
    with pytest.raises(ValueError, match=r"named score 'acc' has 3 entries but the batch has 2 rows"):
        gdpo_advantages(torch.zeros(2, 2), torch.ones(2, 2), [0, 0], {"acc": T([1.0, 0.0, 1.0])}, ["acc"])


# ------------------------------------------------------------------------------ through the registry


def test_gdpo_named_rewards_pass_through_compute_advantages():
    mask = T([[1.0, 1.0, 0.0]] * 4)
    named = {"acc": T([1.0, 0.0, 1.0, 1.0]), "format": T([1.0, 1.0, 0.0, 1.0])}
    inputs = {"token_level_rewards": torch.zeros(4, 3), "response_mask": mask, "index": ["a", "a", "b", "b"]}
    adv, ret = compute_advantages(
        "gdpo", **inputs, values=None, gamma=0.9, norm_by_std=False,
        named_scores=named, reward_keys=["acc", "format"], reward_weights=[1.0, 0.5],
    )
    direct, _ = gdpo_advantages(**inputs, named_scores=named, reward_keys=["acc", "format"], reward_weights=[1.0, 0.5], norm_by_std=False)
    torch.testing.assert_close(adv, direct, atol=0, rtol=0)
    assert torch.equal(adv, ret)
    close(adv[:, 0], [1.183216, -1.183216, -0.591608, 0.591608])


def test_gdpo_through_the_registry_without_named_scores_says_where_they_come_from():
    inputs = {"token_level_rewards": torch.zeros(2, 2), "response_mask": torch.ones(2, 2), "index": [0, 0]}
    with pytest.raises(ValueError, match=r"advantage estimator 'gdpo' needs named_scores: the reward function must return"):
        compute_advantages("gdpo", **inputs, reward_keys=["acc"])


# ------------------------------------------------------------------------------ the doc's table


def _builtin(registry) -> set[str]:
    return {name for name, fn in registry.items() if fn.__module__.startswith("rlhfctl.algorithms")}


def test_the_doc_table_names_every_builtin_estimator_policy_loss_and_aggregation():
    from rlhfctl.algorithms import LOSS_AGG_MODES, POLICY_LOSSES

    doc = (Path(__file__).parents[2] / "docs" / "algorithms.md").read_text()
    rows: dict[str, set[str]] = {"estimator": set(), "policy loss": set(), "aggregation": set()}
    for line in doc.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0] in rows:
            rows[cells[0]].add(cells[1].split("`")[1])
            assert "arxiv.org" in cells[2] and cells[3], line  # a paper and a verl name on every row
    assert rows["estimator"] == _builtin(ADVANTAGE_ESTIMATORS)
    assert rows["policy loss"] == _builtin(POLICY_LOSSES)
    assert rows["aggregation"] == set(LOSS_AGG_MODES)
