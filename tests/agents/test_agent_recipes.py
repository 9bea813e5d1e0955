"""rollout.multi_turn in recipes: validate stops bad tools, environments, loops and formats with exit 2 naming
the key, and a multi-turn run trains end to end (reward, reference, advantages, update, checkpoint, samples)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlhfctl.cli import app

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
ECHO = {"class": "tests.agents.test_agent_loop:EchoTool", "config": {"sleep_s": 0.01}}

BAD_TOOLS = '''
from rlhfctl.agents import Environment, Tool, ToolResult


class BadSchema(Tool):
    name = "bad"
    schema = {"type": "function", "function": {"name": "bad", "parameters": {"type": "objekt"}}}


class NotATool:
    pass


class Env(Environment):
    async def step(self, action_text):
        return "", 0.0, True
'''


def agent_recipe(folder: Path, **multi_turn: Any) -> Path:
    recipe = yaml.safe_load(QUICKSTART.read_text())
    recipe["ray"] = {"backend": "local"}
    recipe["rollout"].update({"n": 2, "max_new_tokens": 8, "multi_turn": {
        "enable": True, "max_turns": 3, "max_response_tokens": 48, "max_tool_response_tokens": 16,
        "format": "test_always_echo", "tools": [ECHO], **multi_turn}})
    recipe["trainer"].update({"total_steps": 2, "batch_size": 4, "mini_batch_size": 4, "output_dir": str(folder / "run"),
                              "log_samples": 1, "save_every": 2, "trace": True})
    path = folder / "agent.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "bad_tools.py").write_text(BAD_TOOLS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("bad_tools", None)
    return tmp_path


def _validate(path: Path) -> Any:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "200"})
    assert "Traceback" not in result.output, result.output
    return result


@pytest.mark.parametrize("multi_turn, key, words", [
    ({"tools": [ECHO, {"class": "no_such_module:Tool"}]}, "rollout.multi_turn.tools[1].class", "cannot import"),
    ({"tools": [{"class": "bad_tools:BadSchema"}]}, "rollout.multi_turn.tools[0].class", "not a valid JSON schema"),
    ({"tools": [{"class": "bad_tools:NotATool"}]}, "rollout.multi_turn.tools[0].class", "not a subclass"),
    ({"tools": [ECHO, ECHO]}, "rollout.multi_turn.tools[1].class", "a second tool named 'echo'"),
    ({"environment": {"class": "bad_tools:Missing"}}, "rollout.multi_turn.environment.class", "no attribute"),
    ({"agent_loop": "bad_tools:Env"}, "rollout.multi_turn.agent_loop", "not a subclass of rlhfctl.agents.AgentLoop"),
    ({"format": "xml"}, "rollout.multi_turn.format", "no tool-call parser 'xml'"),
    ({"max_response_tokens": 120}, "roles.actor.model.config.max_position_embeddings",
     "128 positions cannot hold data.max_prompt_length + rollout.multi_turn.max_response_tokens = 152"),
])
def test_validate_exits_2_naming_the_multi_turn_key(workdir, multi_turn, key, words):
    result = _validate(agent_recipe(workdir, **multi_turn))
    assert result.exit_code == 2, result.output
    assert key in result.output and words in result.output, result.output


def test_validate_passes_a_good_multi_turn_recipe(workdir):
    result = _validate(agent_recipe(workdir))
    assert result.exit_code == 0, result.output


def test_a_multi_turn_recipe_trains_two_steps_with_the_agent_metrics(workdir):
    from rlhfctl.recipe import load_recipe
    from rlhfctl.trainer import run_training

    cfg = load_recipe(agent_recipe(workdir), [])
    run_training(cfg)
    run = workdir / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2]
    for key in ("agent/turns/mean", "agent/tool_calls/mean", "agent/tool_errors/mean", "agent/tool_latency_s/mean",
                "agent/truncated_fraction", "agent/tool/echo/chars/mean", "reward/mean", "response_length/mean",
                "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "rollout/logprob_diff"):
        assert key in records[-1], key
    assert records[-1]["agent/tool_calls/mean"] > 0 and records[-1]["rollout/logprob_diff"] < 1e-3
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert any(message["role"] == "tool" for message in samples[-1]["messages"])
    assert (run / "checkpoints" / "step_2" / "actor" / "checkpoint.json").exists()
    events = json.loads((run / "trace.json").read_text())
    names = {event.get("name") for event in (events["traceEvents"] if isinstance(events, dict) else events)}
    assert "actor.agent.generate" in names and "actor.agent.tool.echo" in names, sorted(str(name) for name in names)
