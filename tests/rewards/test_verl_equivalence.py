"""rlhfctl.rewards scores every case of verl_reward_cases.json exactly as verl 0.9 scored it.

The fixture (written by fixtures/make_verl_reward_cases.py, run with verl installed) holds verl's
numbers for a table of tricky cases (commas, units, currency, signs, decimals, LaTeX fractions,
``\\boxed`` forms, units in ``\\text{}``, missing answers, the 300-character clip...) and for seeded
random answer strings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfctl.rewards import dispatch_by_source, gsm8k, math
from rlhfctl.rewards.gsm8k_answers import extract_gsm8k_answer
from rlhfctl.rewards.math_answers import math_verify_available
from rlhfctl.rewards.math_string_match import (
    UnnormalizableAnswer,
    normalize_math_answer,
)

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "verl_reward_cases.json").read_text(encoding="utf-8"))
GSM8K_CASES = FIXTURE["gsm8k"]
MATH_CASES = FIXTURE["math"]


def _ids(cases: list[dict]) -> list[str]:
    return [case["note"] for case in cases]


def test_the_fixture_covers_enough_cases_per_function():
    assert len(GSM8K_CASES) >= 40 and len(MATH_CASES) >= 40
    assert sum(case["note"].startswith("random") for case in GSM8K_CASES) >= 40
    assert sum(case["note"].startswith("random") for case in MATH_CASES) >= 40


@pytest.mark.parametrize("case", GSM8K_CASES, ids=_ids(GSM8K_CASES))
def test_gsm8k_extracts_the_answer_verl_extracts(case):
    for method, expected in case["extracted"].items():
        assert extract_gsm8k_answer(case["response"], method) == expected, method


@pytest.mark.parametrize("case", GSM8K_CASES, ids=_ids(GSM8K_CASES))
def test_gsm8k_scores_as_verl_under_every_setting(case):
    for setting, expected in zip(FIXTURE["gsm8k_settings"], case["scores"]):
        assert gsm8k([""], [case["response"]], ground_truth=[case["ground_truth"]], **setting) == [expected], setting


def test_gsm8k_scores_a_whole_batch_as_verl():
    responses = [case["response"] for case in GSM8K_CASES]
    truths = [case["ground_truth"] for case in GSM8K_CASES]
    for index, setting in enumerate(FIXTURE["gsm8k_settings"]):
        expected = [case["scores"][index] for case in GSM8K_CASES]
        assert gsm8k([""] * len(responses), responses, ground_truth=truths, **setting) == expected


@pytest.mark.parametrize("case", MATH_CASES, ids=_ids(MATH_CASES))
def test_math_string_match_scores_as_verl_math_reward(case):
    assert math([""], [case["response"]], ground_truth=[case["ground_truth"]], checker="string-match") == [case["string_match"]]


@pytest.mark.skipif(not math_verify_available(), reason="math-verify is not installed (pip install 'rlhfctl[math]')")
@pytest.mark.skipif(FIXTURE["math_verify_version"] is None, reason="the fixture was written without math-verify")
@pytest.mark.parametrize("case", MATH_CASES, ids=_ids(MATH_CASES))
def test_math_verify_scores_as_verl_math_verify(case):
    assert math([""], [case["response"]], ground_truth=[case["ground_truth"]], checker="math-verify") == [case["math_verify"]]


@pytest.mark.parametrize("case", FIXTURE["math_normalization"], ids=[repr(c["text"])[:60] for c in FIXTURE["math_normalization"]])
def test_math_normalization_rewrites_as_verl_strip_string(case):
    if case["normalized"] is None:  # verl's strip_string raised: the answer is compared raw
        with pytest.raises(UnnormalizableAnswer):
            normalize_math_answer(case["text"])
    else:
        assert normalize_math_answer(case["text"]) == case["normalized"]


def test_dispatch_by_source_scores_a_mixed_batch_as_verl_default_compute_score():
    cases = FIXTURE["dispatch"]
    scores = dispatch_by_source(
        [""] * len(cases),
        [case["response"] for case in cases],
        data_source=[case["data_source"] for case in cases],
        ground_truth=[case["ground_truth"] for case in cases],
        checker="string-match",  # verl's default_compute_score grades MATH sources with math_reward
    )
    assert scores == [case["score"] for case in cases]
