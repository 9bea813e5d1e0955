"""Reward functions that fail, through the real `rlhfctl train` (local backend: no Ray needed)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlhfctl.cli.app import app

REWARDS = '''
def raises(prompts, responses, **columns):
    raise RuntimeError("the grader crashed")

def wrong_count(prompts, responses, **columns):
    return [1.0] * (len(responses) - 1)
'''


def run(tmp_path, *overrides):
    rewards = tmp_path / "rewards.py"
    rewards.write_text(REWARDS)
    args = ["train", "quickstart", "ray.backend=local", f"trainer.output_dir={tmp_path / 'run'}", "trainer.total_steps=2",
            "trainer.batch_size=2", "trainer.mini_batch_size=2", "rollout.max_new_tokens=4", "data.num_train=8",
            *[o.replace("REWARDS", str(rewards)) for o in overrides]]
    result = CliRunner().invoke(app, args)
    return result, " ".join(result.output.split())


def test_an_exception_inside_names_the_function_and_the_samples(tmp_path):
    result, output = run(tmp_path, "roles.reward.function=REWARDS:raises")
    assert result.exit_code == 2, result.output
    assert "raises" in output and "the grader crashed" in output and "sample" in output
    assert "Traceback" not in result.output


def test_on_error_zero_scores_the_samples_0_and_counts_them(tmp_path):
    result, _ = run(tmp_path, "roles.reward.function=REWARDS:raises", "roles.reward.on_error=zero")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/errors"] for r in records] == [8.0, 8.0]  # 2 prompts x n=4, every sample failed
    assert all(r["reward/mean"] == 0.0 for r in records)


def test_a_wrong_number_of_scores_is_reported_with_both_counts(tmp_path):
    result, output = run(tmp_path, "roles.reward.function=REWARDS:wrong_count")
    assert result.exit_code == 2, result.output
    assert "wrong_count" in output and "7 scores for 8 samples" in output


@pytest.mark.parametrize("spec", ["no_such_module_xyz:score", "REWARDS:missing_function"])
def test_a_reward_function_that_does_not_import_is_caught_before_launch(tmp_path, spec):
    result, output = run(tmp_path, f"roles.reward.function={spec}")
    assert result.exit_code == 2, result.output
    assert "roles.reward.function" in output
