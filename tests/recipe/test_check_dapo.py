"""validate's checks of DAPO dynamic sampling, the overlong buffer and gdpo's named rewards (exit 2, key and cause)."""

from __future__ import annotations

import pytest

from tests.recipe.builders import BASE_RECIPE, validate_cli, write_recipe


@pytest.fixture
def recipe_file(tmp_path):
    return write_recipe(tmp_path, BASE_RECIPE)


def test_filter_groups_with_one_response_per_prompt_exits_2(recipe_file):
    result = validate_cli(recipe_file, "algorithm.filter_groups.enable=true", "rollout.n=1")
    assert result.exit_code == 2
    assert "algorithm.filter_groups.enable" in result.stderr and "rollout.n" in result.stderr


def test_filter_groups_with_groups_is_accepted(recipe_file):
    result = validate_cli(recipe_file, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=score")
    assert result.exit_code == 0, result.output


def test_an_overlong_buffer_longer_than_the_responses_exits_2(recipe_file):
    result = validate_cli(recipe_file, "roles.reward.overlong_buffer.enable=true", "roles.reward.overlong_buffer.len=999")
    assert result.exit_code == 2
    assert "roles.reward.overlong_buffer.len" in result.stderr and "rollout.max_new_tokens" in result.stderr


def test_an_enabled_overlong_buffer_of_length_0_exits_2(recipe_file):
    result = validate_cli(recipe_file, "roles.reward.overlong_buffer.enable=true")
    assert result.exit_code == 2 and "roles.reward.overlong_buffer.len" in result.stderr


def test_gdpo_without_named_rewards_exits_2(recipe_file):
    result = validate_cli(recipe_file, "algorithm.adv_estimator=gdpo")
    assert result.exit_code == 2 and "algorithm.gdpo_reward_keys" in result.stderr


def test_gdpo_weights_must_match_the_keys(recipe_file):
    result = validate_cli(recipe_file, "algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[acc,format]",
                       "algorithm.gdpo_reward_weights=[1.0]")
    assert result.exit_code == 2 and "1 weights for 2 gdpo_reward_keys" in result.stderr


def test_gdpo_keys_for_another_estimator_exit_2(recipe_file):
    result = validate_cli(recipe_file, "algorithm.gdpo_reward_keys=[acc]")
    assert result.exit_code == 2
    assert "algorithm.gdpo_reward_keys" in result.stderr and "only adv_estimator gdpo" in result.stderr


def test_decoupled_ppo_with_truncated_importance_sampling_exits_2(recipe_file):
    result = validate_cli(recipe_file, "roles.actor.policy_loss=decoupled_ppo", "rollout.importance_cap=2.0")
    assert result.exit_code == 2
    assert "rollout.importance_cap" in result.stderr and "behav_imp_weight_cap" in result.stderr


def test_a_custom_loss_that_takes_behaviour_log_probs_with_truncated_importance_sampling_exits_2(recipe_file):
    """validate reads the actor's own rule (the loss's signature), not decoupled_ppo's name."""
    result = validate_cli(recipe_file, "algorithm.import_modules=[tests.recipe.custom_behaviour_loss]",
                          "roles.actor.policy_loss=test_behaviour_weighted", "rollout.importance_cap=2.0")
    assert result.exit_code == 2
    assert "rollout.importance_cap: policy_loss test_behaviour_weighted takes the behaviour log-probs" in result.stderr
