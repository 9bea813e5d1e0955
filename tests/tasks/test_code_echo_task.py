"""The code_echo task: prompts with stdin/stdout tests in ground_truth, demonstrations that pass them when run."""

from __future__ import annotations

import json

import pytest

from rlhfctl.agents.tools import python_sandbox
from rlhfctl.rewards.code_execution import SETTINGS
from rlhfctl.tasks import code_echo, get_task, task_names


def test_prompts_are_deterministic_and_carry_one_stdio_test() -> None:
    records = code_echo.make_prompts(50, seed=3)
    assert records == code_echo.make_prompts(50, seed=3)
    for record in records:
        digits = record["prompt"].removeprefix("echo ").removesuffix(":").split(" ")
        assert 1 <= len(digits) <= code_echo.MAX_DIGITS and digits[0] != "0"
        assert json.loads(record["ground_truth"]) == {"inputs": [""], "outputs": ["".join(digits)]}


def test_the_task_is_registered_with_demonstrations_and_the_code_reward() -> None:
    assert "code_echo" in task_names()
    task = get_task("code_echo")
    assert task.score is code_echo.score and task.make_demonstrations is code_echo.make_demonstrations
    assert code_echo.score.known_function_kwargs == frozenset(SETTINGS)


@pytest.mark.skipif(bool(python_sandbox.boundary_refusal()), reason="this kernel refuses the sandbox's namespaces")
def test_demonstrations_pass_and_other_text_does_not() -> None:
    prompts = code_echo.make_prompts(3, seed=0)
    demonstrations = code_echo.make_demonstrations(3, seed=0)
    assert [d["prompt"] for d in demonstrations] == [p["prompt"] for p in prompts]
    responses = [demonstrations[0]["response"], "print(0)", json.loads(prompts[2]["ground_truth"])["outputs"][0]]
    scores = code_echo.score([p["prompt"] for p in prompts], responses, [p["ground_truth"] for p in prompts])
    assert [row["score"] for row in scores] == [1.0, 0.0, 0.0]  # a bare number is a program that prints nothing
