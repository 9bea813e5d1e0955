"""The bundled digits task: deterministic prompts and hand-checked reward values."""

from __future__ import annotations

import random

import pytest

from rlhfctl.tasks import Task, UnknownTaskError, get_task, task_names
from rlhfctl.tasks.digits import copy_score, exact_match_score, make_prompts, score


def test_prompts_are_deterministic_and_consistent() -> None:
    first = make_prompts(50, seed=3)
    assert first == make_prompts(50, seed=3)
    assert first != make_prompts(50, seed=4)
    assert make_prompts(0, seed=3) == []
    for record in first:
        assert record["prompt"] == f"digits {' '.join(record['ground_truth'])}:"
        assert record["ground_truth"].isdigit() and 3 <= len(record["ground_truth"]) <= 6
    with pytest.raises(ValueError, match="non-negative"):
        make_prompts(-1, seed=0)


def test_digit_fraction_score() -> None:
    prompts = ["p"] * 5
    responses = ["471", "a1b2", "", "no digits", "12 "]
    assert score(prompts, responses, ground_truth=["471"] * 5) == [1.0, 0.5, 0.0, 0.0, pytest.approx(2 / 3)]


def test_random_policy_scores_low() -> None:
    rng = random.Random(0)
    alphabet = [chr(c) for c in range(32, 127)] + ["\n"]
    responses = ["".join(rng.choice(alphabet) for _ in range(24)) for _ in range(400)]
    mean = sum(score(["p"] * 400, responses)) / 400
    assert 0.05 <= mean <= 0.2


def test_copy_score_gives_partial_credit() -> None:
    truth = ["471", "471", "471", "471", ""]
    responses = ["471", "47", "4710", "x7y", ""]
    assert copy_score(["p"] * 5, responses, ground_truth=truth) == [
        1.0, pytest.approx(2 / 3), 0.75, pytest.approx(1 / 3), 1.0
    ]


def test_exact_match_score() -> None:
    responses = [" 72\n", "72.0", "The answer is 72", "5"]
    truth = ["72", "72", "72", 5]
    assert exact_match_score(["p"] * 4, responses, ground_truth=truth, extra=[0, 1, 2, 3]) == [1.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("fn", [score, copy_score, exact_match_score])
def test_length_mismatch_is_rejected(fn) -> None:
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        fn(["a", "b"], ["1"], ground_truth=["1", "2"])
    with pytest.raises(ValueError, match="column 'ground_truth' has 1 values for 2 responses"):
        fn(["a", "b"], ["1", "2"], ground_truth=["1"])


def test_registry() -> None:
    assert {"digits", "copy"} <= set(task_names())
    task = get_task("digits")
    assert isinstance(task, Task) and task.score is score
    records = task.make_prompts(4, 0)
    rewards = task.score([r["prompt"] for r in records], [r["ground_truth"] for r in records],
                         ground_truth=[r["ground_truth"] for r in records])
    assert rewards == [1.0] * 4
    assert get_task("copy").score is copy_score
    with pytest.raises(UnknownTaskError, match="unknown task 'gsm9k'; bundled tasks are: arithmetic, arithmetic-direct, code_echo, copy, digits, repeat"):
        get_task("gsm9k")
    assert issubclass(UnknownTaskError, ValueError)


def test_the_copy_tasks_demonstrations_answer_with_the_prompts_digits_and_score_1():
    from rlhfctl.tasks.digits import make_copy_demonstrations

    records = make_copy_demonstrations(8, seed=3)
    assert [r["prompt"] for r in records] == [r["prompt"] for r in make_prompts(8, seed=3)]
    assert all(r["response"] == r["ground_truth"] == r["prompt"][len("digits "):-1].replace(" ", "") for r in records)
    assert copy_score([r["prompt"] for r in records], [r["response"] for r in records],
                      ground_truth=[r["ground_truth"] for r in records]) == [1.0] * 8
    assert get_task("copy").make_demonstrations is make_copy_demonstrations
