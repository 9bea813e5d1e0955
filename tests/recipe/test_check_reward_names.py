"""validate calls the reward function once to check the named scores a recipe asks for, and names the math checker."""

from __future__ import annotations

import json

import pytest

from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.validate import validate_recipe
from tests.recipe.builders import BASE_RECIPE, write_recipe

DIGITS_PASS = "roles.reward.function=rlhfctl.tasks.digits:digits_pass"


@pytest.fixture
def recipe_file(tmp_path):
    return write_recipe(tmp_path, BASE_RECIPE)


def _report(recipe_file, *overrides):
    return validate_recipe(load_recipe(recipe_file, list(overrides)))


def test_gdpo_keys_the_reward_does_not_return_are_an_error_naming_what_it_returns(recipe_file):
    report = _report(recipe_file, DIGITS_PASS, "algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[acc,format]")
    [problem] = report.errors
    assert problem.key_path == "algorithm.gdpo_reward_keys"
    assert "does not return 'format'" in problem.message and "it returns acc, digit_fraction" in problem.message


def test_a_named_filter_metric_the_reward_returns_is_accepted(recipe_file):
    report = _report(recipe_file, DIGITS_PASS, "algorithm.filter_groups.enable=true",
                     "algorithm.filter_groups.metric=digit_fraction")
    assert report.ok, [issue.message for issue in report.errors]


def test_a_named_filter_metric_with_a_plain_float_reward_is_an_error(recipe_file):
    report = _report(recipe_file, "roles.reward.function=rlhfctl.tasks.digits:score",
                     "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=format")
    [problem] = report.errors
    assert problem.key_path == "algorithm.filter_groups.metric" and "it returns plain floats" in problem.message


def test_the_math_reward_says_which_checker_is_in_use(recipe_file, tmp_path):
    data = tmp_path / "math.jsonl"
    data.write_text(json.dumps({"prompt": "What is 1/2 + 1/2?", "ground_truth": "1"}) + "\n")
    common = ["roles.reward.function=rlhfctl.rewards:math", f"data.train_files=[{data}]", "data.task=null"]
    forced = _report(recipe_file, *common, "roles.reward.function_kwargs={checker: string-match}")
    assert forced.notes == ["roles.reward.function: rlhfctl.rewards:math checks answers with normalized string match "
                            "(pip install 'rlhfctl[math]' for math-verify)"]
    pytest.importorskip("math_verify")
    assert "checks answers with math-verify" in _report(recipe_file, *common).notes[0]
    assert _report(recipe_file).notes == []
