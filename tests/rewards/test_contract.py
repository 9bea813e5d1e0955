"""Every bundled reward keeps the batch contract: lengths checked, None ground truth 0, odd responses scored, not raised."""

from __future__ import annotations

import pytest

from rlhfctl.rewards import RewardSettingError, dispatch_by_source, format, gsm8k, math

ODD_RESPONSES = [None, "", 7, b"#### 7", "\x00\ufffd", "}" * 50, "\\boxed{" * 50, "####" * 100, "\\frac" * 20, "\\sqrt"]


def _call(name, responses, truths):
    prompts = [""] * len(responses)
    if name == "gsm8k":
        return gsm8k(prompts, responses, ground_truth=truths)
    if name == "math-string":
        return math(prompts, responses, ground_truth=truths, checker="string-match")
    if name == "dispatch":
        return dispatch_by_source(prompts, responses, data_source=["openai/gsm8k"] * len(responses), ground_truth=truths)
    return format(prompts, responses, pattern="####", ground_truth=truths)


@pytest.mark.parametrize("name", ["gsm8k", "math-string", "dispatch", "format"])
def test_misaligned_columns_are_rejected(name):
    with pytest.raises(ValueError, match="ground_truth"):
        _call(name, ["a", "b"], ["1"])


@pytest.mark.parametrize("name", ["gsm8k", "math-string", "dispatch", "format"])
def test_odd_responses_are_scored_without_raising(name):
    scores = _call(name, ODD_RESPONSES, ["7"] * len(ODD_RESPONSES))
    assert len(scores) == len(ODD_RESPONSES) and all(isinstance(score, float) for score in scores)


@pytest.mark.parametrize("name", ["gsm8k", "math-string", "dispatch"])
def test_a_none_ground_truth_scores_zero(name):
    assert _call(name, ["#### 5 \\boxed{5}", "#### 5 \\boxed{5}"], [None, "5"]) == [0.0, 1.0]


def test_gsm8k_reads_bytes_and_number_ground_truths_as_text():
    assert gsm8k(["", ""], [b"#### 7", "#### 7"], ground_truth=["7", 7]) == [1.0, 1.0]


def test_gsm8k_gives_format_score_for_a_wrong_answer_and_zero_for_none():
    scores = gsm8k(["", "", ""], ["#### 5", "#### 6", "no answer"], ground_truth=["5"] * 3, format_score=0.25, score=2)
    assert scores == [2.0, 0.25, 0.0]


def test_gsm8k_rejects_an_unknown_method():
    with pytest.raises(RewardSettingError, match="'strict', 'flexible'"):
        gsm8k([""], ["#### 5"], ground_truth=["5"], method="loose")


def test_settings_for_other_rewards_pass_through_unchecked():
    """A scalar a reward does not take (a setting meant for another) is not a column."""
    assert gsm8k([""], ["#### 5"], ground_truth=["5"], checker="string-match", pattern="x") == [1.0]
