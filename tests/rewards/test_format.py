"""format: a regular-expression reward, hand-checked."""

from __future__ import annotations

import pytest

from rlhfctl.rewards import RewardSettingError, format

RESPONSES = ["<think>a\nb</think> 5", "5 <think>x</think>", "no tags", ""]


def test_search_rewards_a_match_anywhere_and_dot_crosses_newlines():
    assert format([""] * 4, RESPONSES, pattern="<think>.*</think>") == [1.0, 1.0, 0.0, 0.0]


def test_fullmatch_rewards_only_a_match_of_the_whole_response():
    assert format([""] * 4, RESPONSES, pattern="<think>.*</think>.*", mode="fullmatch") == [1.0, 0.0, 0.0, 0.0]


def test_score_sets_the_reward_for_a_match():
    assert format(["", ""], ["#### 12", "12"], pattern=r"#### -?[0-9.,]+$", score=0.5) == [0.5, 0.0]


def test_a_bad_pattern_names_the_pattern_and_the_regex_error():
    with pytest.raises(ValueError, match=r"'\(unclosed'.*missing \), unterminated subpattern"):
        format([""], ["x"], pattern="(unclosed")


@pytest.mark.parametrize("setting", [{"mode": "match"}, {"score": "high"}, {"pattern": ["a"]}])
def test_bad_settings_are_rejected(setting):
    with pytest.raises(RewardSettingError):
        format([""], ["x"], **{"pattern": "x", **setting})
