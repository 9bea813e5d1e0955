"""rollout.agent_server in recipes: validate stops a bad program, a clash with the tool loop, a busy port range and an
unknown tool format with exit 2 naming the key; ``rlhfctl train quickstart`` with a two-turn program trains on
exactly the tokens the endpoint handed the program, with the program's tokens alone in the loss mask."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlhfctl.cli import app
from tests.agents.endpoint_programs import RECORDS_ENV

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
PROGRAM = "tests.agents.endpoint_programs:two_turns"
MULTI_TURN = {"enable": True, "max_turns": 2, "max_response_tokens": 64}


def endpoint_recipe(folder: Path, multi_turn: dict[str, Any] | None = None, **agent_server: Any) -> Path:
    recipe = yaml.safe_load(QUICKSTART.read_text())
    recipe["ray"] = {"backend": "local"}
    recipe["rollout"].update({"n": 2, "max_new_tokens": 8, "multi_turn": multi_turn or MULTI_TURN,
                              "agent_server": {"program": PROGRAM, **agent_server}})
    recipe["trainer"].update({"total_steps": 2, "batch_size": 4, "mini_batch_size": 4, "output_dir": str(folder / "run")})
    path = folder / "endpoint.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _validate(path: Path) -> Any:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "200"})
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture
def busy_port():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


@pytest.mark.parametrize("multi_turn, agent_server, key, words", [
    (None, {"program": "no_such_module:run"}, "rollout.agent_server.program", "cannot import 'no_such_module:run'"),
    (None, {"program": "json:dumps"}, "rollout.agent_server.program", "is not an async function"),
    ({"enable": False}, {}, "rollout.agent_server.program", "needs rollout.multi_turn.enable: true"),
    ({**MULTI_TURN, "tools": [{"class": "tests.agents.test_agent_loop:EchoTool"}]}, {}, "rollout.multi_turn.tools",
     "unused when rollout.agent_server.program drives the rollout"),
    (None, {"tool_format": "xml"}, "rollout.agent_server.tool_format", "no tool-call parser 'xml'"),
    (None, {"port_range": [2000, 1000]}, "rollout.agent_server.port_range", "is empty"),
])
def test_validate_exits_2_naming_the_agent_server_key(tmp_path, monkeypatch, multi_turn, agent_server, key, words):
    monkeypatch.chdir(ROOT)
    result = _validate(endpoint_recipe(tmp_path, multi_turn, **agent_server))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if key in line and words in line]
    assert len(lines) == 1, result.output


def test_validate_refuses_a_port_range_with_no_free_port(tmp_path, monkeypatch, busy_port):
    monkeypatch.chdir(ROOT)
    result = _validate(endpoint_recipe(tmp_path, port_range=[busy_port, busy_port]))
    assert result.exit_code == 2, result.output
    assert f"rollout.agent_server.port_range: 0 of ports {busy_port}..{busy_port} are free on 127.0.0.1" in result.output


def test_validate_passes_a_good_agent_server_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = _validate(endpoint_recipe(tmp_path, port_range=[20000, 20100]))
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_train_quickstart_with_an_agent_program_trains_on_the_tokens_it_was_served(tmp_path):
    records = tmp_path / "served.jsonl"
    output = tmp_path / "run"
    overrides = [
        "ray.backend=local", f"trainer.output_dir={output}", "trainer.total_steps=2", "trainer.batch_size=4",
        "trainer.mini_batch_size=4", "trainer.log_samples=4", "rollout.n=2", "rollout.max_new_tokens=8",
        "rollout.multi_turn={enable: true, max_turns: 2, max_response_tokens: 64}",
        f"rollout.agent_server={{program: '{PROGRAM}', batch_wait_s: 1.0}}",
    ]
    done = subprocess.run([sys.executable, "-m", "rlhfctl.cli", "train", "quickstart", *overrides], cwd=ROOT,
                          env={**os.environ, RECORDS_ENV: str(records)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    metrics = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    served = [json.loads(line) for line in records.read_text().splitlines()]
    assert [record["step"] for record in metrics] == [1, 2] and len(served) == 16  # 4 prompts x n=2, two steps

    def chain(run: dict[str, Any]) -> list[int]:
        last = run["responses"][-1]
        return last["prompt_token_ids"] + last["choices"][0]["token_ids"]

    for step, record in enumerate(metrics):
        runs = served[8 * step: 8 * (step + 1)]  # a step's programs all finish before the next step's start
        for run in runs:  # each second request extends the first: one chain per program
            first, second = run["responses"]
            assert second["prompt_token_ids"][: len(first["prompt_token_ids"]) + len(first["choices"][0]["token_ids"])] == (
                first["prompt_token_ids"] + first["choices"][0]["token_ids"])
        sampled = [sum(len(reply["choices"][0]["token_ids"]) for reply in run["responses"]) for run in runs]
        # the loss mask of the step's batch holds exactly the tokens the endpoint sampled for the programs
        assert record["agent/policy_tokens/mean"] == pytest.approx(sum(sampled) / len(sampled), abs=1e-6)
        assert record["agent/tool/endpoint/requests/mean"] == 2.0 and record["agent/tool/endpoint/errors/mean"] == 0.0
        assert record["agent/tool/endpoint/divergent_requests/mean"] == 0.0 and record["agent/turns/mean"] == 2.0
        assert "actor/pg_loss" in record and "reward/mean" in record

    from rlhfctl.models.tokenizer import CharTokenizer

    decode = CharTokenizer().decode
    texts = {decode(chain(run), skip_special_tokens=True) for run in served}
    samples = [json.loads(line) for line in (output / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8
    for sample in samples:  # the trained sequence, decoded, is one program's served chain
        assert sample["prompt"] + sample["response"] in texts, sample
        assert [m["role"] for m in sample["messages"]] == ["user", "assistant", "user", "assistant"]
