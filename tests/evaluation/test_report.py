"""The numbers of rlhfctl eval: pass@k (Chen et al.'s estimator), mean@n and their intervals over prompts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlhfctl.evaluation.report import Z_95, eval_report, mean_with_interval, pass_at_k, report_ks


@pytest.mark.parametrize("n, correct, k, expected", [
    (4, 0, 1, 0.0), (4, 4, 3, 1.0), (4, 1, 1, 0.25), (4, 1, 2, 0.5), (4, 2, 2, 1 - 1 / 6), (5, 1, 4, 0.8), (3, 1, 3, 1.0),
])
def test_pass_at_k_is_one_minus_the_chance_that_k_draws_miss_every_correct_sample(n, correct, k, expected):
    assert pass_at_k(n, correct, k) == pytest.approx(expected)


def test_pass_at_k_refuses_k_outside_one_to_n():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(2, 1, 3)


def test_the_interval_is_the_normal_95_percent_half_width_over_values():
    mean, half = mean_with_interval(np.array([0.0, 1.0, 1.0, 0.0]))
    assert mean == 0.5 and half == pytest.approx(Z_95 * math.sqrt(1 / 3) / 2)
    assert mean_with_interval(np.array([0.7])) == (pytest.approx(0.7), 0.0)


def test_report_ks_are_one_the_powers_of_two_below_n_and_n():
    assert report_ks(1) == [1] and report_ks(4) == [1, 2, 4] and report_ks(6) == [1, 2, 4, 6]


def test_the_report_averages_per_prompt_then_over_prompts_per_source():
    # prompt a: scores 1, 0 (math); prompt b: 1, 1 (math); prompt c: 0, 0 (code)
    scores = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    groups = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    sources = np.array(["math", "math", "math", "math", "code", "code"], dtype=object)
    report = eval_report(scores, groups, sources, n=2, correct=scores)
    assert list(report) == ["all", "code", "math"]
    assert report["all"]["prompts"] == 3 and report["all"]["samples"] == 6
    assert report["all"]["mean"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert report["math"]["mean"] == pytest.approx(0.75) and report["code"]["mean"] == 0.0
    assert report["math"]["pass@1"] == pytest.approx(0.75) and report["math"]["pass@2"] == 1.0
    assert report["all"]["pass@2"] == pytest.approx(2 / 3)
    assert report["code"]["pass@2_ci95"] == 0.0


def test_without_a_correctness_column_the_report_has_no_pass_at_k():
    report = eval_report(np.array([0.2, 0.4]), np.array(["a", "b"], dtype=object), None, n=1)
    assert list(report) == ["all"] and not any(key.startswith("pass@") for key in report["all"])
