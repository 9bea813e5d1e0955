"""Running pipelines: completion markers, skipping complete stages on rerun, and the end-to-end quickstart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlhfctl.pipeline import COMPLETE_MARKER, PipelineObserver, load_pipeline, pipeline_from_dict, run_pipeline

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"


class Recorder(PipelineObserver):
    """Remembers which stages ran and which were skipped."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def stage_finished(self, plan, result) -> None:
        self.events.append(("done", plan.name))

    def stage_skipped(self, plan, result) -> None:
        self.events.append(("skipped", plan.name))


@pytest.fixture
def fake_training(monkeypatch):
    """run_training replaced by a stand-in that writes what a stage writes (or fails for a named stage)."""
    failing: set[str] = set()

    def run_training(cfg, reporter=None):
        out = Path(cfg.trainer.output_dir)
        if out.name in failing:
            raise RuntimeError(f"{out.name} broke")
        (out / "model").mkdir(parents=True, exist_ok=True)
        (out / "model" / "config.json").write_text("{}")
        (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
        return {"steps": 1, "loss/first": 2.0, "loss/last": 1.0, "eval/accuracy": 0.9}

    monkeypatch.setattr("rlhfctl.trainer.run.run_training", run_training)
    return failing


def three_stages(tmp_path: Path, *overrides: str):
    data = {"output_dir": str(tmp_path), "stages": [
        {"name": "sft", "recipe": "sft-quickstart.yaml", "overrides": ["ray.backend=local"]},
        {"name": "reward", "recipe": "reward-model-quickstart.yaml",
         "overrides": ["ray.backend=local", "roles.reward.model.path=${stages.sft.output}", "~roles.reward.model.config"]},
        {"name": "dpo", "recipe": "dpo-quickstart.yaml",
         "overrides": ["ray.backend=local", "roles.actor.model.path=${stages.sft.output}", "~roles.actor.model.config"]},
    ]}
    return pipeline_from_dict(data, list(overrides), base_dir=RECIPES)


def run(spec) -> list[tuple[str, str]]:
    recorder = Recorder()
    run_pipeline(spec, recorder)
    return recorder.events


def test_complete_stages_are_skipped_and_a_rerun_stage_reruns_the_later_ones(tmp_path, fake_training):
    assert run(three_stages(tmp_path)) == [("done", "sft"), ("done", "reward"), ("done", "dpo")]
    marker = json.loads((tmp_path / "sft" / COMPLETE_MARKER).read_text())
    assert marker["stage"] == "sft" and marker["summary"]["loss/last"] == 1.0 and marker["fingerprint"]
    assert run(three_stages(tmp_path)) == [("skipped", "sft"), ("skipped", "reward"), ("skipped", "dpo")]
    # A changed recipe reruns that stage and the ones after it.
    assert run(three_stages(tmp_path, "reward.trainer.total_steps=7")) == [("skipped", "sft"), ("done", "reward"), ("done", "dpo")]
    # So does a stage whose marker (or model) is gone.
    (tmp_path / "sft" / COMPLETE_MARKER).unlink()
    assert run(three_stages(tmp_path, "reward.trainer.total_steps=7")) == [("done", "sft"), ("done", "reward"), ("done", "dpo")]
    summary = json.loads((tmp_path / "pipeline.json").read_text())
    assert [stage["status"] for stage in summary["stages"]] == ["done", "done", "done"]
    assert summary["stages"][1]["headline"] == "eval accuracy 0.9"


def test_a_failed_stage_is_not_marked_complete_and_stops_the_pipeline(tmp_path, fake_training):
    fake_training.add("reward")
    with pytest.raises(RuntimeError, match="reward broke"):
        run(three_stages(tmp_path))
    assert (tmp_path / "sft" / COMPLETE_MARKER).is_file()
    assert not (tmp_path / "reward" / COMPLETE_MARKER).exists() and not (tmp_path / "dpo").exists()
    fake_training.clear()
    assert run(three_stages(tmp_path)) == [("skipped", "sft"), ("done", "reward"), ("done", "dpo")]


def test_a_real_complete_stage_is_skipped_without_touching_its_outputs(ray_session, tmp_path):
    data = {"output_dir": str(tmp_path), "stages": [{"name": "sft", "recipe": "sft-quickstart.yaml", "overrides": [
        "trainer.total_steps=4", "data.num_train=64", "data.num_val=16", "trainer.val_every=0"]}]}
    start = time.perf_counter()
    assert run(pipeline_from_dict(data, base_dir=RECIPES)) == [("done", "sft")]
    first = time.perf_counter() - start
    metrics = tmp_path / "sft" / "metrics.jsonl"
    before = (metrics.read_text(), metrics.stat().st_mtime_ns, (tmp_path / "sft" / "model" / "model.safetensors").stat().st_mtime_ns)
    assert len(metrics.read_text().splitlines()) == 4
    start = time.perf_counter()
    assert run(pipeline_from_dict(data, base_dir=RECIPES)) == [("skipped", "sft")]
    second = time.perf_counter() - start
    after = (metrics.read_text(), metrics.stat().st_mtime_ns, (tmp_path / "sft" / "model" / "model.safetensors").stat().st_mtime_ns)
    assert after == before
    assert second < first / 5, (first, second)


@pytest.mark.slow
def test_the_quickstart_pipeline_end_to_end(tmp_path):
    command = [sys.executable, "-m", "rlhfctl.cli", "pipeline", "recipes/pipeline-quickstart.yaml", f"output_dir={tmp_path}"]
    env = {**os.environ, "COLUMNS": "160"}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "stage 3/3 ppo: done" in result.stdout and "pipeline finished" in result.stdout
    stages = {stage["name"]: stage for stage in json.loads((tmp_path / "pipeline.json").read_text())["stages"]}
    assert stages["sft"]["summary"]["loss/last"] < stages["sft"]["summary"]["loss/first"]
    assert stages["reward"]["summary"]["eval/accuracy"] >= 0.8
    assert stages["ppo"]["summary"]["reward/last_mean"] > stages["ppo"]["summary"]["reward/first_mean"]
    for name in ("sft", "reward", "ppo"):
        assert (tmp_path / name / COMPLETE_MARKER).is_file() and (tmp_path / name / "metrics.jsonl").is_file()
        assert (tmp_path / name / "model" / "config.json").is_file()
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and again.stdout.count("skipped (complete)") == 3, again.stdout[-2000:]
