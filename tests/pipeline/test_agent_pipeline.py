"""The bundled agent pipeline (recipes/agent-pipeline.yaml): SFT on calculator chats, then GRPO with the tool.

A short run of the real file: both stages run, the RL stage's trajectories call the calculator
(``agent/tool_calls/mean`` > 0) and the held-out accuracy (``val/reward/mean``) is logged. The measured
learning (accuracy after SFT and after RL, the full-length run) is in docs/performance.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfctl.pipeline import COMPLETE_MARKER, PipelineObserver, load_pipeline, plan_stages, run_pipeline

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "recipes" / "agent-pipeline.yaml"


class Recorder(PipelineObserver):
    def __init__(self) -> None:
        self.done: list[str] = []

    def stage_finished(self, plan, result) -> None:
        self.done.append(plan.name)


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_agent_pipeline_trains_on_tool_chats_then_runs_grpo_with_the_calculator(tmp_path) -> None:
    sft, grpo = plan_stages(load_pipeline(PIPELINE, [f"output_dir={tmp_path}"]))  # the sft model does not exist yet
    assert (sft.algorithm, grpo.algorithm) == ("sft", "ppo")
    assert sft.cfg.data.task == "arithmetic" and grpo.cfg.data.task == "arithmetic"
    assert grpo.cfg.roles.actor.model.path == str(tmp_path / "sft" / "model") and grpo.cfg.roles.actor.model.config is None
    assert grpo.cfg.roles.reward.function == "rlhfctl.tasks.arithmetic:score"
    assert grpo.cfg.data.apply_chat_template is True and grpo.cfg.algorithm.adv_estimator == "grpo"
    multi_turn = grpo.cfg.rollout.multi_turn
    assert multi_turn.enable is True and multi_turn.format == "hermes"
    assert [tool["class"] for tool in multi_turn.tools] == ["rlhfctl.agents.tools:Calculator"]
    assert grpo.cfg.trainer.val_every and grpo.cfg.data.num_val > 0


@pytest.mark.slow
def test_a_short_agent_pipeline_calls_the_tool_and_logs_validation_accuracy(tmp_path) -> None:
    overrides = [
        f"output_dir={tmp_path}",
        "sft.ray.backend=local", "grpo.ray.backend=local",
        "sft.trainer.total_steps=40", "sft.trainer.val_every=0", "sft.data.num_train=640", "sft.data.num_val=0",
        "grpo.trainer.total_steps=2", "grpo.trainer.val_every=2", "grpo.data.num_val=8",
        "grpo.trainer.batch_size=4", "grpo.trainer.mini_batch_size=4",
    ]
    recorder = Recorder()
    run_pipeline(load_pipeline(PIPELINE, overrides), recorder)
    assert recorder.done == ["sft", "grpo"]
    for name in ("sft", "grpo"):
        assert (tmp_path / name / COMPLETE_MARKER).is_file() and (tmp_path / name / "model" / "config.json").is_file()
    steps = read_metrics(tmp_path / "grpo" / "metrics.jsonl")
    assert [step["step"] for step in steps] == [1, 2]
    assert all(step["agent/tool_calls/mean"] > 0 for step in steps), [step["agent/tool_calls/mean"] for step in steps]
    assert "val/reward/mean" in steps[-1] and 0.0 <= steps[-1]["val/reward/mean"] <= 1.0
    assert steps[-1]["val/samples"] == 8
