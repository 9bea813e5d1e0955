"""rollout.environment resolved once: a known kind runs as the one effective multi-turn environment the workers read;
an unknown kind, a malformed value or both environment keys leave the rollout as written, with one line to report."""

from __future__ import annotations

import pytest

from rlhfctl.environments.choice import environment_choice
from rlhfctl.environments.kinds import ENVIRONMENT_KINDS
from rlhfctl.recipe.resolved import resolve_mapping
from tests.workers.recipes import tiny_recipe

ADAPTER = "rlhfctl.environments.openenv_adapter:OpenEnvEnvironment"


def test_an_openenv_url_becomes_the_multi_turn_environment_the_workers_read():
    recipe = resolve_mapping(tiny_recipe(rollout={
        "environment": "openenv:http://127.0.0.1:8123?action_field=guess",
        "environment_config": {"reset_columns": ["ground_truth"]},
        "multi_turn": {"max_turns": 2, "max_response_tokens": 40},
    }))
    rollout = recipe.rollout
    expected = {"class": ADAPTER, "config": {"base_url": "http://127.0.0.1:8123", "action_field": "guess",
                                             "reset_columns": ["ground_truth"]}}
    assert rollout.settings.multi_turn.enable and rollout.agent and rollout.multi_turn is rollout.settings.multi_turn
    assert rollout.settings.multi_turn.environment == expected and rollout.environment.entry == expected
    assert rollout.response_width == 40 and rollout.settings.multi_turn.max_turns == 2
    assert (rollout.environment.kind, rollout.environment.problem) == ("openenv", None)
    assert not recipe.sections.rollout.multi_turn.enable  # the section as written is left as written
    with pytest.raises(TypeError, match="read-only"):
        rollout.settings.multi_turn.environment["class"] = "x:Y"


def test_without_rollout_environment_nothing_changes():
    recipe = resolve_mapping(tiny_recipe())
    assert recipe.rollout.environment is None and not recipe.rollout.agent
    assert recipe.rollout.settings is recipe.sections.rollout


@pytest.mark.parametrize("rollout, words", [
    ({"environment": "gym:CartPole-v1"}, "rollout.environment: unknown kind 'gym' in 'gym:CartPole-v1' (known kinds: openenv)"),
    ({"environment": "http://127.0.0.1:8000"}, "did you mean 'openenv:http://127.0.0.1:8000'?"),
    ({"environment": "openenv"}, "rollout.environment: expected <kind>:<target> such as openenv:http://127.0.0.1:8000"),
    ({"environment": "openenv:m:C", "multi_turn": {"environment": {"class": "m:Env"}}},
     "rollout.environment and rollout.multi_turn.environment are both set: keep one"),
    ({"environment": "openenv:http://h:1?seed=1"}, "unknown query key 'seed'"),
])
def test_an_unusable_value_is_recorded_and_the_rollout_left_as_written(rollout, words):
    recipe = resolve_mapping(tiny_recipe(rollout=rollout))
    assert words in recipe.rollout.environment.problem and "\n" not in recipe.rollout.environment.problem
    assert recipe.rollout.environment.entry is None
    assert recipe.rollout.settings.multi_turn.environment == (rollout.get("multi_turn") or {}).get("environment")


def test_every_kind_is_one_registry_entry_whose_adapter_is_an_environment():
    from rlhfctl.agents import Environment
    from rlhfctl.recipe.importing import import_class

    assert "openenv" in ENVIRONMENT_KINDS
    for name, kind in ENVIRONMENT_KINDS.items():
        assert kind.name == name and kind.checks and kind.extra
        assert issubclass(import_class(kind.adapter, "adapter"), Environment)
    choice = environment_choice({"environment": "openenv:pkg.envs:EchoEnv", "environment_config": {"base_url": "http://h:2"}})
    assert choice.entry == {"class": ADAPTER, "config": {"base_url": "http://h:2", "client": "pkg.envs:EchoEnv"}}


def test_an_environment_config_without_an_environment_is_a_warning_and_a_choice_problem_an_error():
    from rlhfctl.recipe.check_environments import check_environments

    (issue,) = check_environments(resolve_mapping(tiny_recipe(rollout={"environment_config": {"action_field": "guess"}})))
    assert (issue.severity, issue.key_path) == ("warning", "rollout.environment_config")
    assert issue.message == "rollout.environment_config is set but rollout.environment is not: nothing reads it"
    (issue,) = check_environments(resolve_mapping(tiny_recipe(rollout={"environment": "gym:x"})))
    assert (issue.severity, issue.key_path) == ("error", "rollout.environment") and "known kinds: openenv" in issue.message
    assert check_environments(resolve_mapping(tiny_recipe())) == []
