"""validate rejects an unknown roles.actor.policy_loss and a loss-specific setting the chosen loss does not use."""

from __future__ import annotations

import pytest

from tests.recipe.builders import BASE_RECIPE, validate_cli, write_recipe


@pytest.fixture
def recipe_file(tmp_path):
    return write_recipe(tmp_path, BASE_RECIPE)


def test_unknown_policy_loss_exits_2_listing_the_registered_names(recipe_file):
    result = validate_cli(recipe_file, "roles.actor.policy_loss=vanila")
    assert result.exit_code == 2
    assert "roles.actor.policy_loss" in result.stderr
    assert "clip_cov" in result.stderr and "gspo" in result.stderr and "vanilla" in result.stderr


def test_a_setting_the_loss_does_not_use_exits_2_naming_key_and_loss(recipe_file):
    result = validate_cli(recipe_file, "roles.actor.clip_cov_ratio=0.001")
    assert result.exit_code == 2
    assert "roles.actor.clip_cov_ratio" in result.stderr and "vanilla" in result.stderr


def test_the_setting_with_its_loss_is_accepted(recipe_file):
    result = validate_cli(recipe_file, "roles.actor.policy_loss=clip_cov", "roles.actor.clip_cov_ratio=0.001")
    assert "clip_cov_ratio" not in result.stderr, result.stderr
