"""rlhfctl validate (and train) on rollout.environment: every problem is one line naming the key, exit 2, no
traceback: an unreachable server, an unknown kind, both environment keys, a missing extra, a client class that is
not one, an action field the server lacks, a wrong setting; a reachable server with a text action passes."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app

# the quickstart's model holds 128 positions: 32 of prompt + the multi-turn response
SMALL = ["rollout.multi_turn.max_response_tokens=64", "rollout.multi_turn.max_tool_response_tokens=16"]


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(command: str, *overrides: str) -> Any:
    result = CliRunner().invoke(app, [command, "quickstart", *SMALL, *overrides], env={"COLUMNS": "200"})
    assert "Traceback" not in result.output, result.output
    return result


def error_lines(result: Any) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("command", ["validate", "train"])
def test_an_unreachable_server_is_one_line_naming_rollout_environment(command, tmp_path):
    port = closed_port()
    result = run(command, f"rollout.environment=openenv:http://127.0.0.1:{port}", f"trainer.output_dir={tmp_path / 'run'}")
    assert result.exit_code == 2, result.output
    (line,) = error_lines(result)
    assert line.startswith(f"error: rollout.environment: the OpenEnv server at http://127.0.0.1:{port} does not answer "
                           f"http://127.0.0.1:{port}/health within 3 s"), line
    assert "start it, or fix the URL" in line


@pytest.mark.parametrize("overrides, words", [
    (["rollout.environment=gym:CartPole-v1"], "error: rollout.environment: unknown kind 'gym' in 'gym:CartPole-v1' (known kinds: openenv)"),
    (["rollout.environment=openenv:tests.environments.guess_env:GuessClient",
      "rollout.multi_turn.environment={class: tests.agents.test_agent_loop:EchoTool}"],
     "error: rollout.environment and rollout.multi_turn.environment are both set: keep one"),
    (["rollout.environment=openenv:http://127.0.0.1:1", "rollout.environment_config.colour=red"],
     "error: rollout.environment_config: unknown key 'colour' for openenv"),
    (["rollout.environment=openenv:json:JSONDecoder"], "error: rollout.environment: 'json:JSONDecoder' is not an OpenEnv client"),
    (["rollout.environment=openenv:no_such_module:Env"], "error: rollout.environment: cannot import 'no_such_module:Env'"),
])
def test_a_bad_environment_is_one_error_naming_its_key(overrides, words):
    result = run("validate", *overrides)
    assert result.exit_code == 2, result.output
    assert [line[:len(words)] for line in error_lines(result)] == [words], result.output


def test_a_missing_extra_names_the_extra_to_install(monkeypatch):
    import rlhfctl.environments.openenv_checks as checks

    monkeypatch.setattr(checks, "openenv_installed", lambda: False)
    result = run("validate", "rollout.environment=openenv:http://127.0.0.1:1")
    assert result.exit_code == 2, result.output
    assert error_lines(result) == ["error: rollout.environment: openenv needs the openenv-core package: "
                                   "pip install 'rlhfctl[openenv]'"]


def test_a_reachable_server_with_a_text_action_passes_and_a_wrong_action_field_does_not(guess_url):
    assert run("validate", f"rollout.environment=openenv:{guess_url}").exit_code == 0
    typed = run("validate", "rollout.environment=openenv:tests.environments.guess_env:GuessClient",
                f"rollout.environment_config.base_url={guess_url}")
    assert typed.exit_code == 0, typed.output
    result = run("validate", f"rollout.environment=openenv:{guess_url}?action_field=message")
    assert result.exit_code == 2, result.output
    assert error_lines(result) == [f"error: rollout.environment: the action of {guess_url} has no field 'message' "
                                   "(its fields: guess); set rollout.environment_config.action_field (or ?action_field= "
                                   "in the URL) to the field the model's text goes in"]
