"""dispatch_by_source: each sample goes to the reward its data_source names; unknown sources are an error."""

from __future__ import annotations

import pytest

from rlhfctl.rewards import (
    SOURCE_REWARDS,
    RewardSettingError,
    dispatch_by_source,
    gsm8k,
    math,
)


def test_the_table_routes_gsm8k_and_the_math_sources():
    assert SOURCE_REWARDS["openai/gsm8k"] is gsm8k
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert SOURCE_REWARDS[source] is math


def test_a_mixed_batch_is_scored_by_source_in_sample_order():
    responses = ["#### 72", "\\boxed{\\dfrac12}", "The answer is 72", "\\boxed{3}", "#### 1,234"]
    sources = ["openai/gsm8k", "lighteval/MATH", "openai/gsm8k", "HuggingFaceH4/MATH-500", "openai/gsm8k"]
    truths = ["72", "\\frac{1}{2}", "72", "4", "1234"]
    scores = dispatch_by_source([""] * 5, responses, data_source=sources, ground_truth=truths, checker="string-match")
    assert scores == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_settings_reach_the_routed_reward():
    scores = dispatch_by_source(["", ""], ["The answer is 72", "#### 7"], data_source=["openai/gsm8k"] * 2,
                                ground_truth=["72", "72"], method="flexible", format_score=0.5)
    assert scores == [1.0, 0.5]


def test_columns_reach_the_routed_reward_row_by_row(monkeypatch):
    seen = {}

    def spy(prompts, responses, ground_truth, extra_info, **columns):
        seen[responses[0]] = (prompts, extra_info, columns)
        return [0.0] * len(responses)

    monkeypatch.setattr("rlhfctl.rewards.dispatch.SOURCE_REWARDS", {"a": spy, "b": spy})
    dispatch_by_source(["p0", "p1", "p2"], ["r0", "r1", "r2"], data_source=["a", "b", "a"], ground_truth=["", "", ""],
                       extra_info=[{"i": 0}, {"i": 1}, {"i": 2}], method="flexible")
    assert seen["r0"] == (["p0", "p2"], [{"i": 0}, {"i": 2}], {"data_source": ["a", "a"], "method": "flexible"})
    assert seen["r1"] == (["p1"], [{"i": 1}], {"data_source": ["b"], "method": "flexible"})


def test_an_unknown_source_names_itself_and_the_known_ones():
    with pytest.raises(RewardSettingError, match=r"'math_dapo'.*known sources: openai/gsm8k, lighteval/MATH"):
        dispatch_by_source(["", ""], ["#### 1", "#### 1"], data_source=["openai/gsm8k", "math_dapo"], ground_truth=["1", "1"])


def test_the_table_is_read_only():
    with pytest.raises(TypeError):
        SOURCE_REWARDS["mine"] = gsm8k  # type: ignore[index]
