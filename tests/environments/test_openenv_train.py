"""rlhfctl train quickstart with rollout.environment=openenv:<url>: two steps against a real OpenEnv server on
127.0.0.1, each trajectory an episode over the server's protocol; the rewards are the ones the server gave for
those responses, and the observations are attended context the loss does not see."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app
from tests.environments.guess_rules import guess_step

pytestmark = pytest.mark.slow

STEPS, PROMPTS, N, MAX_NEW, TURNS = 2, 4, 2, 8, 2


def test_training_on_an_openenv_server_rewards_what_the_server_gave(ray_session, guess_url, tmp_path):
    from tests.environments.guess_env import EPISODES

    output, before = tmp_path / "run", len(EPISODES)
    result = CliRunner().invoke(app, [
        "train", "quickstart", f"rollout.environment=openenv:{guess_url}",
        "rollout.environment_config.reset_columns=[ground_truth]",
        f"trainer.total_steps={STEPS}", f"trainer.batch_size={PROMPTS}", f"trainer.mini_batch_size={PROMPTS}",
        f"rollout.n={N}", f"rollout.max_new_tokens={MAX_NEW}", f"rollout.multi_turn.max_turns={TURNS}",
        "rollout.multi_turn.max_response_tokens=48", "rollout.multi_turn.max_tool_response_tokens=16",
        "roles.reward.function=tests.environments.guess_rules:score", f"trainer.log_samples={PROMPTS}",
        f"trainer.output_dir={output}", "--quiet",
    ])
    assert result.exit_code == 0, result.output
    episodes = EPISODES[before:]
    assert len(episodes) == STEPS * PROMPTS * N  # one session per trajectory, each reset once
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2]
    for step, record in enumerate(records):
        served = episodes[step * PROMPTS * N:(step + 1) * PROMPTS * N]  # the steps run one after the other
        sums = [sum(reward for _, reward in episode["steps"]) for episode in served]
        assert record["reward/mean"] == pytest.approx(sum(sums) / len(sums), abs=1e-6)
        assert record["agent/tool_calls/mean"] == pytest.approx(sum(len(e["steps"]) for e in served) / len(served))
        # mask-1 tokens are the policy's turns only; an observation between two turns is attended but mask 0
        assert record["agent/policy_tokens/mean"] <= TURNS * MAX_NEW
        assert any(len(episode["steps"]) == TURNS for episode in served)  # a wrong first guess: an observation turn
        assert record["response_length/mean"] > record["agent/policy_tokens/mean"]
    samples = [json.loads(line) for line in (output / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == STEPS * PROMPTS
    for sample in samples:
        secret = sample["prompt"].split()[1]  # "digits 4 7 1:": the server's secret is the first ground-truth digit
        actions = [m["content"] for m in sample["messages"] if m["role"] == "assistant"]
        steps = [guess_step(text, secret) for text in actions]
        expected = sum(reward for _, reward, _ in steps)
        assert sample["tool_rewards"] == pytest.approx(expected) and sample["score"] == pytest.approx(expected)
        assert any(e["secret"] == secret and e["steps"] == [(a, r) for a, (_, r, _) in zip(actions, steps)] for e in episodes)
        observations = [m["content"] for m in sample["messages"][1:] if m["role"] == "user"]
        assert observations == [feedback for feedback, _, done in steps if not done][:len(actions) - 1]
