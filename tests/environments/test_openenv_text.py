"""The OpenEnv adapter's rules, without a server: how a target and rollout.environment_config become its settings,
which action field the model's text fills, and what text an observation shows."""

from __future__ import annotations

import pytest

from rlhfctl.environments.openenv_settings import OpenEnvSettings, adapter_config
from rlhfctl.environments.openenv_text import observation_text, text_action_field

METADATA = {"type": "object", "additionalProperties": True}


def schema(required: tuple[str, ...] = (), **properties: dict) -> dict:
    return {"properties": {"metadata": METADATA, **properties}, "required": list(required)}


def test_a_url_target_gives_the_base_url_and_the_query_settings():
    config = adapter_config("http://127.0.0.1:8123/?action_field=message&observation_field=text", {"reset_observation": True})
    assert config == {"base_url": "http://127.0.0.1:8123", "action_field": "message", "observation_field": "text",
                      "reset_observation": True}
    settings = OpenEnvSettings.from_config(config)
    assert settings.client is None and settings.http_url == "http://127.0.0.1:8123"
    assert OpenEnvSettings.from_config(adapter_config("ws://h:1", {})).http_url == "http://h:1"


def test_a_client_class_target_keeps_its_base_url_config_or_the_default():
    assert adapter_config("envs.echo:EchoEnv", {}) == {"client": "envs.echo:EchoEnv"}
    settings = OpenEnvSettings.from_config(adapter_config("envs.echo:EchoEnv", {"base_url": "http://h:9"}))
    assert (settings.client, settings.base_url) == ("envs.echo:EchoEnv", "http://h:9")
    assert OpenEnvSettings.from_config({"client": "m:C"}).base_url == "http://127.0.0.1:8000"


@pytest.mark.parametrize("target, config, words", [
    ("http://h:1?action_field=a", {"action_field": "b"}, "rollout.environment_config.action_field: also set to 'a'"),
    ("http://h:1?seed=3", {}, "unknown query key 'seed'"),
    ("http://h:1", {"base_url": "http://other:2"}, "rollout.environment_config.base_url: rollout.environment already names"),
    ("http://", {}, "has no host"),
])
def test_a_target_and_config_that_disagree_are_one_line_naming_the_key(target, config, words):
    with pytest.raises(ValueError, match="rollout.environment") as caught:
        adapter_config(target, config)
    assert words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("config, words", [
    ({"colour": "red"}, "rollout.environment_config: unknown key 'colour'"),
    ({"reset_columns": "ground_truth"}, "rollout.environment_config.reset_columns: expected a list"),
    ({"reset_observation": "yes"}, "rollout.environment_config.reset_observation: expected true or false"),
    ({"message_timeout_s": 0}, "rollout.environment_config.message_timeout_s: must be > 0"),
    ({"action_field": ""}, "rollout.environment_config.action_field: expected a non-empty string"),
])
def test_wrong_settings_name_their_key(config, words):
    with pytest.raises(ValueError) as caught:
        OpenEnvSettings.from_config({"base_url": "http://h:1", **config})
    assert words in str(caught.value)


def test_the_text_goes_in_the_actions_only_string_field():
    action = schema(("message",), message={"type": "string"}, count={"type": "integer"})
    assert text_action_field(action, None, "the action") == "message"
    optional = schema(code={"anyOf": [{"type": "string"}, {"type": "null"}]})
    assert text_action_field(optional, None, "the action") == "code"


def test_a_named_field_wins_and_several_or_no_string_fields_ask_for_one():
    two = schema(("code",), code={"type": "string"}, note={"type": "string"})
    assert text_action_field(two, "code", "X") == "code"
    with pytest.raises(ValueError, match=r"X has string fields code, note; set rollout.environment_config.action_field"):
        text_action_field(two, None, "X")
    with pytest.raises(ValueError, match="X has no string field; set"):
        text_action_field(schema(n={"type": "integer"}), None, "X")
    with pytest.raises(ValueError, match=r"X has no field 'text' \(its fields: code, note\)"):
        text_action_field(two, "text", "X")


def test_an_action_with_other_required_fields_is_refused():
    action = schema(("code", "language"), code={"type": "string"}, language={"type": "integer"})
    with pytest.raises(ValueError, match="X also requires language: rlhfctl fills one text field"):
        text_action_field(action, None, "X")


def test_an_observation_shows_its_named_field_its_only_string_or_its_fields_as_json():
    observation = {"feedback": "higher", "tries": 2, "reward": 1.0, "done": False, "metadata": {"x": 1}}
    assert observation_text(observation, None) == "higher"
    assert observation_text(observation, "tries") == "2"
    assert observation_text({"a": "x", "b": "y", "done": True}, None) == '{"a": "x", "b": "y"}'
    assert observation_text({"board": [[1, 0]], "reward": 0.5}, None) == '{"board": [[1, 0]]}'
    assert observation_text({"reward": 0.5, "done": True}, None) == ""
    with pytest.raises(ValueError, match="observation_field"):
        observation_text(observation, "score")
