"""The existing commands on stage recipes: validate, the essentials before train, inspect-dispatch's refusal."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app


@pytest.fixture
def no_training(monkeypatch):
    """rlhfctl.trainer with a run_training that only records the recipe it got."""
    import rlhfctl.trainer

    seen = {}
    # The real package stays (train imports its output-dir guard); only the run is replaced.
    monkeypatch.setattr(rlhfctl.trainer, "run_training", lambda cfg, reporter: seen.setdefault("cfg", cfg))
    return seen


@pytest.mark.parametrize("recipe, lines", [
    ("sft-quickstart", ["roles.actor: inline qwen2", "sft: next-token loss on response tokens", "32 demonstrations/step"]),
    ("reward-model-quickstart", ["roles.reward: inline qwen2", "Bradley-Terry loss, margin 0", "main: 1 rank(s) [reward]"]),
    ("dpo-quickstart", ["dpo: beta 0.1, reference roles.reference", "16 preference pairs/step", "eval on 64 generated"]),
])
def test_train_shows_the_stage_essentials(no_training, recipe, lines):
    result = CliRunner().invoke(app, ["train", recipe])
    assert result.exit_code == 0, result.output
    for line in lines:
        assert line in result.stdout, (line, result.stdout)
    assert no_training["cfg"].algorithm.name in ("sft", "reward_model", "dpo")


def test_validate_names_the_worker_a_stage_needs():
    result = CliRunner().invoke(app, ["validate", "sft-quickstart", "roles.actor.worker=workers.actor.ActorWorker"])
    assert result.exit_code == 2
    assert "lacks registered method(s) train_sft, eval_sft needed by algorithm.name=sft" in result.stderr
    assert "use roles.actor.worker: workers.sft.SFTWorker" in result.stderr


def test_validate_wants_a_reference_for_dpo():
    result = CliRunner().invoke(app, ["validate", "dpo-quickstart", "~roles.reference"])
    assert result.exit_code == 2 and "roles.reference: dpo compares the policy with a frozen reference" in result.stderr


def test_inspect_dispatch_explains_that_a_stage_makes_one_call_per_step():
    result = CliRunner().invoke(app, ["inspect-dispatch", "reward-model-quickstart"])
    assert result.exit_code == 2 and "reward.train_reward_model (ALL_TO_ALL" in result.stderr
