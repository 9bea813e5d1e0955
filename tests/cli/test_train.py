"""rlhfctl train: validation first, the essentials, then run_training with a reporter; errors from the trainer."""

from __future__ import annotations

import pytest

from rlhfctl.cli import app
from rlhfctl.cli.reporters import PlainReporter
from rlhfctl.single_controller import DispatchEvent


@pytest.fixture
def fake_trainer(monkeypatch):
    """Replace rlhfctl.trainer.run_training with one that drives the reporter like the real one."""
    calls = {}

    def run_training(cfg, reporter):
        calls["cfg"], calls["reporter"] = cfg, reporter
        reporter.run_started({"output_dir": cfg.trainer.output_dir, "total_steps": cfg.trainer.total_steps})
        for step in range(1, cfg.trainer.total_steps + 1):
            reporter.step_started(step, cfg.trainer.total_steps)
            event = DispatchEvent("actor", "generate_sequences", "ALL_TO_ALL", "ALL", [0, 1], [8, 8], started=0.0)
            reporter.dispatch_started(event)
            event.finished = 1.0
            reporter.dispatch_finished(event)
            reporter.step_finished(step, {"reward/mean": 0.5 * step, "actor/pg_loss": -0.1, "time/step": 1.25})
        reporter.message("saved checkpoint runs/x/step_2")
        reporter.run_finished({"steps": cfg.trainer.total_steps, "reward/last_mean": 1.0})
        return {}

    _replace_run_training(monkeypatch, run_training)
    return calls


def _replace_run_training(monkeypatch, run_training) -> None:
    """The real trainer package stays (the train command imports its submodules); only run_training is swapped."""
    import rlhfctl.trainer

    monkeypatch.setattr(rlhfctl.trainer, "run_training", run_training, raising=False)


def test_train_runs_with_plain_reporter_off_a_terminal(runner, recipe_file, fake_trainer):
    result = runner.invoke(app, ["train", str(recipe_file), "trainer.total_steps=2"])
    assert result.exit_code == 0, result.output
    assert fake_trainer["cfg"].trainer.total_steps == 2
    assert isinstance(fake_trainer["reporter"], PlainReporter)
    out = result.stdout
    assert "grpo" in out and "16 prompts x n=4 = 64 samples/step" in out  # essentials
    assert "step 2/2  reward=1 pg_loss=-0.1 step_s=1.25" in out
    assert "generate_sequences" not in out.split("run started")[1]  # dispatch lines only with --verbose
    assert "run finished\n  steps: 2\n  reward/last_mean: 1\n" in out


def test_train_verbose_logs_dispatches(runner, recipe_file, fake_trainer):
    result = runner.invoke(app, ["train", str(recipe_file), "trainer.total_steps=1", "--verbose"])
    assert "-> actor.generate_sequences ALL_TO_ALL ranks=0-1 rows/rank=8" in result.stdout


def test_train_quiet_prints_nothing(runner, recipe_file, fake_trainer):
    result = runner.invoke(app, ["train", str(recipe_file), "trainer.total_steps=1", "--quiet"])
    assert result.exit_code == 0 and result.stdout == ""


def test_train_interrupted_exits_130(runner, recipe_file, monkeypatch):
    def run_training(cfg, reporter):
        raise KeyboardInterrupt

    _replace_run_training(monkeypatch, run_training)
    result = runner.invoke(app, ["train", str(recipe_file)])
    assert result.exit_code == 130 and "interrupted" in result.stderr


def test_train_user_error_from_the_trainer_exits_2(runner, recipe_file, monkeypatch):
    from rlhfctl.data.errors import DataFileError

    def run_training(cfg, reporter):
        raise DataFileError("prompts.jsonl:7: line is not valid JSON")

    _replace_run_training(monkeypatch, run_training)
    result = runner.invoke(app, ["train", str(recipe_file)])
    assert result.exit_code == 2 and "prompts.jsonl:7" in result.stderr and "Traceback" not in result.output


def test_train_internal_error_exits_1_with_traceback(runner, recipe_file, monkeypatch):
    def run_training(cfg, reporter):
        raise RuntimeError("a bug")

    _replace_run_training(monkeypatch, run_training)
    result = runner.invoke(app, ["train", str(recipe_file)])
    assert result.exit_code == 1 and "internal error: RuntimeError: a bug" in result.stderr
