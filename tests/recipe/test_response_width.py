"""Agent rollouts are as wide as the whole trajectory: what validate, inspect-dispatch and the memory plan count."""

from __future__ import annotations

from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.check_runtime import longest_row
from rlhfctl.recipe.dataflow import TensorSpec, resolve_dims
from rlhfctl.recipe.resolved import resolve
from tests.recipe.builders import BASE_RECIPE, write_recipe

MULTI_TURN = ["rollout.multi_turn.enable=true", "rollout.multi_turn.max_response_tokens=96"]


def test_the_response_is_max_new_tokens_wide_or_the_trajectory_budget_with_multi_turn(tmp_path):
    recipe = write_recipe(tmp_path, BASE_RECIPE)
    single, agent = load_recipe(recipe, []), load_recipe(recipe, MULTI_TURN)
    spec = TensorSpec("responses", ("rows", "response_len"), "int64")
    assert resolve_dims(spec, 8, resolve(single)) == (8, 32) and resolve_dims(spec, 8, resolve(agent)) == (8, 96)
    assert longest_row(resolve(single)) == (64, "data.max_prompt_length 32 + rollout.max_new_tokens 32")
    assert longest_row(resolve(agent)) == (128, "data.max_prompt_length 32 + rollout.multi_turn.max_response_tokens 96")
