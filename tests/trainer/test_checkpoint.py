"""Atomic checkpoints (also when the roles finish writing later) and the metrics log's resume behaviour."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from rlhfctl.recipe.resolved import resolve_mapping
from rlhfctl.trainer import checkpoint
from rlhfctl.trainer.metrics import MetricsLog, first_non_finite, mean_over_ranks
from rlhfctl.trainer.trainer_base import TrainerBase


def _write_role(directory, value):
    (directory / "actor").mkdir()
    (directory / "actor" / "weights.txt").write_text(value)


def test_save_renames_into_place_and_points_latest_at_it(tmp_path):
    path = checkpoint.save_checkpoint(tmp_path, 3, {"step": 3}, lambda d: _write_role(d, "w3"))
    assert path == tmp_path / "checkpoints" / "step_3"
    assert (path / "actor" / "weights.txt").read_text() == "w3"
    assert checkpoint.read_latest(tmp_path) == path
    assert checkpoint.load_driver_state(path) == {"step": 3}
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_a_crash_during_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    checkpoint.save_checkpoint(tmp_path, 1, {"step": 1}, lambda d: _write_role(d, "w1"))

    def crash(directory):
        _write_role(directory, "half")
        raise KeyboardInterrupt("killed mid-save")

    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(tmp_path, 2, {"step": 2}, crash)
    latest = checkpoint.read_latest(tmp_path)
    assert latest.name == "step_1"
    assert (latest / "actor" / "weights.txt").read_text() == "w1"


def test_keep_last_prunes_old_checkpoints(tmp_path):
    for step in range(1, 5):
        checkpoint.save_checkpoint(tmp_path, step, {"step": step}, lambda d: _write_role(d, "w"), keep_last=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert names == ["step_3", "step_4"]


def test_metrics_log_on_resume_drops_steps_after_the_checkpoint(tmp_path):
    log = MetricsLog(tmp_path)
    for step in range(1, 6):
        log.write(step, {"reward/mean": float(step)})
    resumed = MetricsLog(tmp_path, resume_after_step=3)
    resumed.write(4, {"reward/mean": 40.0})
    steps = [record["step"] for record in resumed.read()]
    assert steps == [1, 2, 3, 4]
    assert resumed.read()[-1]["reward/mean"] == 40.0
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1


def test_metric_helpers():
    assert mean_over_ranks([{"a": 1.0}, {"a": 3.0}]) == {"a": 2.0}
    assert mean_over_ranks({"a": 1}) == {"a": 1.0}
    assert first_non_finite({"x": 1.0, "y": float("nan")}, ("x", "y")) == "y"
    assert first_non_finite({"x": 1.0}, ("x", "z")) is None


def test_resume_point_never_auto_and_explicit(tmp_path):
    assert checkpoint.resume_point("never", tmp_path) is None
    assert checkpoint.resume_point("auto", tmp_path) is None  # nothing saved yet: start fresh
    saved = checkpoint.save_checkpoint(tmp_path, 2, {"step": 2}, lambda d: _write_role(d, "w"))
    assert checkpoint.resume_point("auto", tmp_path) == saved
    assert checkpoint.resume_point(str(saved), tmp_path) == saved
    from rlhfctl.recipe.errors import RecipeError

    with pytest.raises(RecipeError, match="trainer.resume: .* is not a checkpoint directory"):
        checkpoint.resume_point(str(tmp_path), tmp_path)


def test_a_non_finite_metric_stops_training_naming_metric_phase_and_step(tmp_path):
    from types import SimpleNamespace

    from rlhfctl.cli.errors import EXIT_DIVERGED, exit_code_for
    from rlhfctl.trainer.ppo_trainer import PPOTrainer, TrainingDiverged

    fake = SimpleNamespace(output_dir=tmp_path)
    PPOTrainer._check_finite(fake, 3, {"reward/mean": 0.5, "actor/pg_loss": 0.1})  # finite: no error
    with pytest.raises(TrainingDiverged, match=r"step 7: actor/pg_loss is nan \(phase: actor\).*last good checkpoint") as caught:
        PPOTrainer._check_finite(fake, 7, {"reward/mean": 0.5, "actor/pg_loss": float("nan")})
    assert exit_code_for(caught.value) == EXIT_DIVERGED == 4


class BackgroundRole:
    """A role group whose save leaves its directory unfinished until ``finish_checkpoint``; logs each call."""

    def __init__(self, output_dir, log):
        self.output_dir, self.log, self.pending = output_dir, log, None

    def save_checkpoint(self, directory, blocking=True):
        latest = checkpoint.read_latest(self.output_dir)
        self.log.append(("save", Path(directory).name, latest.name if latest else None))
        staging = Path(directory) / ".actor.saving"
        _write_role(Path(directory), "w")
        (Path(directory) / "actor").rename(staging)
        self.pending = (staging, Path(directory) / "actor")

    def finish_checkpoint(self):
        self.log.append(("finish",))
        staging, target = self.pending
        staging.rename(target)

    def shutdown(self):
        self.log.append(("shutdown",))


class BackgroundTrainer(TrainerBase):
    """The checkpoint part of a trainer, on one :class:`BackgroundRole`."""

    def __init__(self, output_dir):
        self.output_dir, self.log = output_dir, []
        self.cfg = OmegaConf.create({"trainer": {"keep_last": 0, "save_on_interrupt": True, "trace": False}})
        self.recipe = resolve_mapping(OmegaConf.to_container(self.cfg))  # what the trainer reads
        self.reporter = SimpleNamespace(message=lambda text: self.log.append(("message", text)))
        self.batcher = SimpleNamespace(state_dict=lambda: {"position": 0})
        self.role = BackgroundRole(output_dir, self.log)
        self.groups = self.role
        self.start_step = self.completed_step = self.saved_step = 0
        self.pending_checkpoint = None

    def trainable_groups(self):
        return [self.role]

    def write_trace(self):
        return None


def test_a_trainer_save_leaves_latest_until_the_roles_finish_writing(tmp_path):
    trainer = BackgroundTrainer(tmp_path)
    assert trainer.save(1) == tmp_path / "checkpoints" / "step_1"
    assert checkpoint.read_latest(tmp_path) is None  # a crash now resumes from scratch, not a half checkpoint
    assert trainer.wait_for_checkpoint() == tmp_path / "checkpoints" / "step_1"
    assert checkpoint.read_latest(tmp_path).name == "step_1"
    assert (checkpoint.read_latest(tmp_path) / "actor" / "weights.txt").is_file()
    assert trainer.wait_for_checkpoint() is None


def test_the_next_trainer_save_waits_for_the_previous_one(tmp_path):
    trainer = BackgroundTrainer(tmp_path)
    trainer.save(1)
    trainer.save(2)
    saves = [entry for entry in trainer.log if entry[0] in ("save", "finish")]
    assert saves == [("save", "step_1.tmp", None), ("finish",), ("save", "step_2.tmp", "step_1")]
    assert checkpoint.read_latest(tmp_path).name == "step_1"


def test_stopping_finishes_the_checkpoint_being_written(tmp_path):
    from rlhfctl.trainer.run import _save_on_interrupt

    trainer = BackgroundTrainer(tmp_path)
    trainer.save(1)
    trainer.completed_step = 2  # a step after the save, then Ctrl-C or SIGTERM
    _save_on_interrupt(trainer, trainer.reporter)
    assert [entry[0] for entry in trainer.log if entry[0] != "message"] == ["save", "finish", "save", "finish"]
    assert checkpoint.read_latest(tmp_path).name == "step_2"

    failing = BackgroundTrainer(tmp_path / "error")
    failing.save(3)
    failing.shutdown()  # the run stopped on an error: the pending save is still completed
    assert checkpoint.read_latest(tmp_path / "error").name == "step_3"
    assert failing.log[-1] == ("shutdown",)
