"""combined: named rewards and their weighted sum, hand-computed."""

from __future__ import annotations

import pytest

from rlhfctl.rewards import RewardSettingError, combined

PROMPTS = ["", "", ""]
RESPONSES = ["Thinking.\n#### 72", "#### 70", "72"]
TRUTHS = ["72", "72", "72"]
GDPO_REWARDS = {
    "acc": "rlhfctl.rewards:gsm8k",
    "format": {"function": "rlhfctl.rewards:format", "kwargs": {"pattern": r"#### -?[0-9.,]+$"}},
}


def test_each_sample_gets_the_weighted_sum_and_each_named_reward():
    rows = combined(PROMPTS, RESPONSES, rewards=GDPO_REWARDS, weights={"acc": 1.0, "format": 0.5}, ground_truth=TRUTHS)
    # acc (strict gsm8k): 1, 0, 0; format: 1, 1, 0; score = 1*acc + 0.5*format
    assert rows == [
        {"score": 1.5, "acc": 1.0, "format": 1.0},
        {"score": 0.5, "acc": 0.0, "format": 1.0},
        {"score": 0.0, "acc": 0.0, "format": 0.0},
    ]


def test_weights_default_to_one_for_each_name():
    rows = combined(PROMPTS, RESPONSES, rewards=GDPO_REWARDS, ground_truth=TRUTHS)
    assert [row["score"] for row in rows] == [2.0, 1.0, 0.0]


def test_spec_kwargs_reach_their_reward_only():
    rewards = {"strict": "rlhfctl.rewards:gsm8k", "flexible": {"function": "rlhfctl.rewards:gsm8k", "kwargs": {"method": "flexible"}}}
    rows = combined(PROMPTS, RESPONSES, rewards=rewards, weights={"strict": 2.0, "flexible": -1.0}, ground_truth=TRUTHS)
    assert [(row["strict"], row["flexible"], row["score"]) for row in rows] == [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (0.0, 1.0, -1.0)]


def test_user_functions_get_only_the_columns_they_take_and_dict_results_are_flattened():
    rewards = {"len": "tests.rewards.reward_fns:length", "tag": {"function": "tests.rewards.reward_fns:tagged", "kwargs": {"bonus": 0.25}}}
    rows = combined(PROMPTS, ["ab", "72", ""], rewards=rewards, weights={"len": 0.5}, ground_truth=TRUTHS, extra_info=[{}, {}, {}])
    # len: 2, 2, 0 (weight 0.5); tag: 0, 1, 0 (weight 1); tag.bonus: 0.25 each
    assert rows == [
        {"score": 1.0, "len": 2.0, "tag": 0.0, "tag.bonus": 0.25},
        {"score": 2.0, "len": 2.0, "tag": 1.0, "tag.bonus": 0.25},
        {"score": 0.0, "len": 0.0, "tag": 0.0, "tag.bonus": 0.25},
    ]


def test_a_sub_reward_may_return_the_column_form():
    rows = combined(["", ""], ["x", "y"], rewards={"col": "tests.rewards.reward_fns:columns"}, weights={"col": 2.0})
    assert rows == [{"score": 2.0, "col": 1.0, "col.len": 1.0}, {"score": 0.0, "col": 0.0, "col.len": 1.0}]


@pytest.mark.parametrize(
    ("rewards", "weights", "message"),
    [
        ({}, None, "must map names"),
        ({"score": "rlhfctl.rewards:gsm8k"}, None, "'score' is the reward itself"),
        ({"a/b": "rlhfctl.rewards:gsm8k"}, None, "has a '/'"),
        ({"acc": {"fn": "rlhfctl.rewards:gsm8k"}}, None, "rewards.acc must be"),
        ({"acc": "rlhfctl.rewards:gsm8k"}, {"acc": 1.0, "fmt": 2.0}, "weights for 'fmt'"),
        ({"acc": "rlhfctl.rewards:gsm8k"}, {"acc": "heavy"}, "must be a number"),
    ],
)
def test_bad_settings_are_rejected(rewards, weights, message):
    with pytest.raises(RewardSettingError, match=message):
        combined(PROMPTS, RESPONSES, rewards=rewards, weights=weights, ground_truth=TRUTHS)


def test_a_sub_reward_with_the_wrong_number_of_scores_is_named():
    with pytest.raises(ValueError, match="'short' returned"):
        combined(PROMPTS, RESPONSES, rewards={"short": "tests.rewards.reward_fns:wrong_length"}, ground_truth=TRUTHS)


def test_an_unloadable_spec_says_what_is_wrong():
    from rlhfctl.rewards.functions import RewardFunctionError

    with pytest.raises(RewardFunctionError, match="no attribute 'nope'"):
        combined(PROMPTS, RESPONSES, rewards={"x": "rlhfctl.rewards:nope"}, ground_truth=TRUTHS)
