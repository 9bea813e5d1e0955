"""The bundled distillation pipeline (recipes/distill-pipeline.yaml): SFT makes a teacher, a fresh student distils.

A short run of the real file: both stages run, the distill stage's teacher is the SFT stage's model, and every step
logs the teacher's signal. The measured learning against GRPO is in docs/performance.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfctl.pipeline import COMPLETE_MARKER, load_pipeline, plan_stages, run_pipeline

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "recipes" / "distill-pipeline.yaml"


def test_the_distill_stage_learns_from_the_sft_stages_model(tmp_path) -> None:
    teacher, distill = plan_stages(load_pipeline(PIPELINE, [f"output_dir={tmp_path}"]))
    assert (teacher.algorithm, distill.algorithm) == ("sft", "ppo")
    assert teacher.cfg.data.task == "copy" and teacher.cfg.roles.actor.model.config.hidden_size == 128
    assert distill.cfg.roles.teacher.model.path == str(tmp_path / "teacher" / "model")
    assert distill.cfg.roles.actor.model.config.hidden_size == 64  # a fresh, smaller student
    assert distill.cfg.roles.reference is None and distill.cfg.algorithm.distillation.mix == 0.0


@pytest.mark.slow
def test_a_short_distill_pipeline_logs_the_teachers_signal(tmp_path) -> None:
    overrides = [f"output_dir={tmp_path}", "teacher.ray.backend=local", "distill.ray.backend=local",
                 "teacher.trainer.total_steps=4", "teacher.trainer.val_every=0", "teacher.data.num_val=0",
                 "distill.trainer.total_steps=2", "distill.trainer.val_every=2", "distill.data.num_val=4",
                 "distill.trainer.batch_size=4", "distill.trainer.mini_batch_size=4"]
    run_pipeline(load_pipeline(PIPELINE, overrides))
    assert (tmp_path / "teacher" / COMPLETE_MARKER).is_file() and (tmp_path / "distill" / COMPLETE_MARKER).is_file()
    records = [json.loads(line) for line in (tmp_path / "distill" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["distill/reverse_kl/mean"] > 0 and r["distill/teacher_log_prob/mean"] < 0 for r in records)
    assert "val/reward/mean" in records[-1]
