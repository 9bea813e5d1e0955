"""math_backend names the checker math uses; checker chooses it; a missing math-verify is a clear error."""

from __future__ import annotations

import importlib.metadata

import pytest

from rlhfctl.rewards import RewardSettingError, math, math_answers, math_backend


def test_string_match_is_named_as_such():
    assert math_backend("string-match") == "normalized string match"


def test_auto_falls_back_to_the_string_match_without_math_verify(monkeypatch):
    monkeypatch.setattr(math_answers, "math_verify_available", lambda: False)
    assert math_backend() == "normalized string match"
    # string match: the last \boxed only, so a bare "5" scores 0
    assert math(["", ""], ["\\boxed{\\dfrac12}", "The answer is 5"], ground_truth=["0.5", "5"]) == [1.0, 0.0]


def test_asking_for_math_verify_without_it_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(math_answers, "math_verify_available", lambda: False)
    with pytest.raises(RewardSettingError, match=r"pip install 'rlhfctl\[math\]'"):
        math([""], ["\\boxed{5}"], ground_truth=["5"], checker="math-verify")


def test_an_unknown_checker_is_rejected():
    with pytest.raises(RewardSettingError, match="'auto', 'math-verify', 'string-match'"):
        math_backend("sympy")


@pytest.mark.skipif(not math_answers.math_verify_available(), reason="math-verify is not installed")
def test_auto_uses_math_verify_when_installed_and_names_its_version():
    assert math_backend() == f"math-verify {importlib.metadata.version('math-verify')}"
    assert math(["", ""], ["\\boxed{2\\pi}", "The answer is 5"], ground_truth=["\\pi \\cdot 2", "5"]) == [1.0, 1.0]


@pytest.mark.skipif(not math_answers.math_verify_available(), reason="math-verify is not installed")
def test_math_verify_scores_off_the_main_thread_too():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        scores = pool.submit(math, ["", ""], ["\\boxed{\\frac{1}{2}}", "\\boxed{3}"], ground_truth=["0.5", "4"]).result()
    assert scores == [1.0, 0.0]


@pytest.mark.skipif(not math_answers.math_verify_available(), reason="math-verify is not installed")
def test_math_verify_leaves_an_alarm_set_before_it_armed():
    import signal

    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    outer = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, if it uses signals
    try:
        signal.setitimer(signal.ITIMER_REAL, 100.0)
        assert math([""], ["\\boxed{1/2}"], ground_truth=["0.5"], checker="math-verify") == [1.0]
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 90.0 < remaining <= 100.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, *outer)
        signal.signal(signal.SIGALRM, previous)
