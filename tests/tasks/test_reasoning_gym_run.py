"""The bundled reasoning-gym recipe trains through the CLI on a mixture of two reasoning-gym tasks: the training
reward is logged per task (the mean of reasoning-gym's own score_answer over that task's samples, every sample
logged), and validation per task."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app
from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.resolved import resolve
from rlhfctl.trainer.prompt_source import source_records

reasoning_gym = pytest.importorskip("reasoning_gym")
from reasoning_gym.utils import extract_answer  # noqa: E402  (after the skip: an optional extra)

pytestmark = pytest.mark.slow

LEGS = "reasoning_gym:leg_counting?min_animals=1&max_animals=1&max_instances=1"
SUMS = "reasoning_gym:basic_arithmetic?max_terms=2&max_digits=1&operators=[+]&allow_parentheses=false"
SOURCES = ("reasoning_gym/basic_arithmetic", "reasoning_gym/leg_counting")
OVERRIDES = [
    "~data.task", f"data.tasks=[{{name: '{LEGS}'}}, {{name: '{SUMS}'}}]",
    "data.num_train=4", "data.num_val=4", "data.max_prompt_length=224", "roles.actor.model.config.max_position_embeddings=256",
    "trainer.total_steps=2", "trainer.batch_size=4", "trainer.mini_batch_size=4", "trainer.val_every=2",
    "trainer.log_samples=4", "rollout.n=1", "rollout.val_n=2", "rollout.max_new_tokens=8",  # n 1: every sample logged
]


def test_two_steps_on_a_mixture_log_the_reward_per_task_as_reasoning_gym_scores_the_samples(ray_session, tmp_path):
    output = tmp_path / "run"
    overrides = [*OVERRIDES, f"trainer.output_dir={output}"]
    result = CliRunner().invoke(app, ["train", "reasoning-gym-quickstart", *overrides, "--quiet"])
    assert result.exit_code == 0, result.output
    steps = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [step["step"] for step in steps] == [1, 2]
    last = steps[-1]
    for source in SOURCES:
        assert last[f"val/{source}/samples"] == 4  # 2 prompts (weights 1:1 of data.num_val 4) x rollout.val_n 2
        assert 0.0 <= last[f"val/{source}/pass@2"] <= 1.0 and f"val/{source}/reward/mean" in last

    recipe = resolve(load_recipe("recipes/reasoning-gym-quickstart.yaml", overrides))
    records = {record["prompt"]: record for record in source_records(recipe, "train")}
    samples = [json.loads(line) for line in (output / "samples.jsonl").read_text().splitlines() if line.strip()]
    assert len(samples) == 8  # every sample of both steps: 4 prompts x n = 1
    for step in steps:
        logged = [sample for sample in samples if sample["step"] == step["step"]]
        assert {sample["prompt"] for sample in logged} == set(records)  # data.num_train = trainer.batch_size
        for source in SOURCES:
            own = [_score_answer(records[sample["prompt"]], sample["response"]) for sample in logged
                   if records[sample["prompt"]]["data_source"] == source]
            assert len(own) == 2 and step[f"reward/{source}/mean"] == pytest.approx(sum(own) / len(own))
        assert [sample["score"] for sample in logged] == [_score_answer(records[s["prompt"]], s["response"]) for s in logged]


def _score_answer(record: dict, response: str) -> float:
    """reasoning-gym's own score of a response to a record: its dataset's score_answer of the tagged answer."""
    where = record["reasoning_gym"]
    dataset = reasoning_gym.create_dataset(where["dataset"], seed=where["seed"], size=where["size"], **where["config"])
    return float(dataset.score_answer(extract_answer(response), dataset[where["index"]]))
