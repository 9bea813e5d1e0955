"""The pipeline views: stage lines, per-step metrics of each algorithm, and the final table."""

from __future__ import annotations

import io
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console

from rlhfctl.cli.pipeline import PlainPipelineView, RichPipelineView, make_pipeline_view, step_metrics
from rlhfctl.pipeline import StagePlan, StageResult


def plans() -> list[StagePlan]:
    cfg = OmegaConf.create({"trainer": {"total_steps": 2}})
    return [StagePlan(0, "sft", "sft", Path("out/sft"), cfg, "f0", "sft.yaml"),
            StagePlan(1, "ppo", "ppo", Path("out/ppo"), cfg, "f1", "quickstart.yaml")]


def drive(view) -> None:
    sft, ppo = plans()
    view.pipeline_started([sft, ppo], Path("out"))
    view.stage_skipped(sft, StageResult("sft", "sft", "skipped", 0.0, "eval loss 2.1", "out/sft/model"))
    view.stage_started(ppo)
    reporter = view.stage_reporter(ppo)
    for step in (1, 2):
        reporter.step_started(step, 2)
        reporter.step_finished(step, {"reward/mean": 0.5 * step, "actor/kl_loss": 0.001, "time/step": 0.2})
    reporter.message("wrote model out/ppo/model")
    result = StageResult("ppo", "ppo", "done", 12.5, "reward 0.5 -> 1", "out/ppo/model")
    view.stage_finished(ppo, result)
    view.pipeline_finished([StageResult("sft", "sft", "skipped", 0.0, "eval loss 2.1", "out/sft/model"), result], 13.0)


def test_step_metrics_follow_the_algorithm():
    assert step_metrics("sft", {"loss": 2.5, "eval/loss": 2.25, "time/step": 0.1}) == "loss=2.5 eval_loss=2.25 step_s=0.1"
    assert step_metrics("reward_model", {"loss": 0.5, "accuracy": 0.75}) == "loss=0.5 acc=0.75"
    assert step_metrics("ppo", {"reward/mean": 1.0, "actor/kl_loss": 0.01}) == "reward=1 kl=0.01"


def test_plain_view_prints_stage_and_step_lines_then_the_table():
    stream = io.StringIO()
    drive(PlainPipelineView(stream, Console(file=stream, width=160)))
    out = stream.getvalue()
    assert "pipeline: 2 stages (sft, ppo) -> out" in out
    assert "stage 1/2 sft: skipped (complete)  eval loss 2.1" in out
    assert "  ppo step 2/2  reward=1 kl=0.001 step_s=0.2" in out
    assert "ppo: wrote model out/ppo/model" in out and "stage 2/2 ppo: done in 12.5s  reward 0.5 -> 1" in out
    assert "pipeline finished in 13.0s" in out and "skipped" in out.split("pipeline finished")[1]


def test_rich_view_draws_live_and_ends_with_the_table():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=140, color_system=None)
    view = make_pipeline_view(False, console)
    assert isinstance(view, RichPipelineView)
    with view:
        drive(view)
    out = stream.getvalue()
    assert "pipeline finished in 13.0s" in out and "reward 0.5 -> 1" in out and "eval loss 2.1" in out
    assert view.live is None and view.status == {"sft": "skipped", "ppo": "done"}
