"""Security defaults the user sees: trusted remote code is announced."""

from __future__ import annotations


def test_train_prints_a_warning_when_remote_code_is_trusted(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import rlhfctl.trainer
    from rlhfctl.cli.app import app

    monkeypatch.setattr(rlhfctl.trainer, "run_training", lambda cfg, reporter: {})
    result = CliRunner().invoke(app, ["train", "quickstart", f"trainer.output_dir={tmp_path}",
                                      "roles.actor.model.trust_remote_code=true"])
    assert result.exit_code == 0, result.output
    assert "trust_remote_code is ON for actor" in " ".join(result.output.split())
