"""Staleness without an off-policy correction: validate warns naming the keys that add one, and inspect-dispatch labels
the actor's update off-policy (with the correction it has, or none)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app
from rlhfctl.recipe import load_recipe, validate_recipe
from rlhfctl.recipe.check_placement import check_staleness_correction
from rlhfctl.recipe.off_policy import actor_update_note, off_policy_corrections
from rlhfctl.recipe.resolved import resolve
from rlhfctl.recipe.validate import PPO_CHECKS
from tests.recipe.builders import validate_cli

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
SEPARATE = ["resource_pools.gen={process_on_nodes: [2], use_gpu: false}", "rollout.placement=separate", "rollout.pool=gen"]
WARNING = ("trainer.max_staleness: 1 with rollout.placement: separate trains the actor on samples up to 1 policy version "
           "old, and no off-policy correction is set, so the update weighs them as if the current policy had sampled "
           "them; add one: rollout.importance_cap: 2.0 (truncated importance sampling, the policy loss unchanged) or "
           "roles.actor.policy_loss: decoupled_ppo (optionally capped by roles.actor.behav_imp_weight_cap); or set "
           "trainer.max_staleness: 0")
CORRECTIONS = {"rollout.importance_cap=2.0": "rollout.importance_cap: 2.0",
               "roles.actor.policy_loss=decoupled_ppo": "roles.actor.policy_loss: decoupled_ppo"}


def warnings(*overrides: str) -> dict[str, str]:
    report = validate_recipe(load_recipe(QUICKSTART, list(overrides)))
    assert report.errors == [], report.errors
    return {issue.key_path: issue.message for issue in report.warnings}


def update_entry(*overrides: str, table: bool = False):
    """inspect-dispatch's actor.update_actor entry (JSON), or the printed tree."""
    args = ["inspect-dispatch", str(QUICKSTART), *overrides, "--method", "update_actor"]
    result = CliRunner().invoke(app, args if table else [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return result.stdout if table else json.loads(result.stdout)["dataflow"][0]


def test_the_check_is_one_of_validates_ppo_checks():
    assert check_staleness_correction in PPO_CHECKS


def test_validate_warns_about_staleness_without_a_correction_and_exits_0():
    result = validate_cli(QUICKSTART, *SEPARATE, "trainer.max_staleness=1")
    assert result.exit_code == 0, result.output
    assert " ".join(result.output.split()).count("no off-policy correction is set") == 1
    for key in ("rollout.importance_cap: 2.0", "roles.actor.policy_loss: decoupled_ppo", "trainer.max_staleness: 0"):
        assert key in " ".join(result.output.split()), key
    assert warnings(*SEPARATE, "trainer.max_staleness=1")["trainer.max_staleness"] == WARNING
    assert "versions old" in warnings(*SEPARATE, "trainer.max_staleness=3")["trainer.max_staleness"]


@pytest.mark.parametrize("correction", sorted(CORRECTIONS))
def test_a_correction_silences_the_warning(correction):
    assert "trainer.max_staleness" not in warnings(*SEPARATE, "trainer.max_staleness=1", correction)
    assert off_policy_corrections(resolve(load_recipe(QUICKSTART, [*SEPARATE, correction]))) == [CORRECTIONS[correction]]


@pytest.mark.parametrize("overrides", [SEPARATE, [*SEPARATE, "trainer.max_staleness=0"]])
def test_an_on_policy_rollout_group_gets_no_warning(overrides):
    assert "trainer.max_staleness" not in warnings(*overrides)


def test_inspect_dispatch_labels_a_stale_update_without_a_correction_off_policy():
    entry = update_entry(*SEPARATE, "trainer.max_staleness=2")
    assert entry["note"] == ("off-policy: samples up to 2 versions old (trainer.max_staleness), no correction; old "
                             "log-probs are the detached current ones (no compute_log_prob pass)")
    assert entry["off_policy"] == {"max_sample_age": 2, "corrections": []}
    assert "off-policy: samples up to 2 versions old" in " ".join(update_entry(*SEPARATE, "trainer.max_staleness=2", table=True).split())


@pytest.mark.parametrize("correction", sorted(CORRECTIONS))
def test_inspect_dispatch_names_the_correction(correction):
    entry = update_entry(*SEPARATE, "trainer.max_staleness=1", correction)
    assert entry["note"].startswith(f"off-policy: samples up to 1 version old (trainer.max_staleness), corrected by "
                                    f"{CORRECTIONS[correction]}; ")
    assert entry["off_policy"] == {"max_sample_age": 1, "corrections": [CORRECTIONS[correction]]}


def test_on_policy_updates_keep_their_label():
    assert update_entry()["note"] == "on-policy: old log-probs are the detached current ones (no compute_log_prob pass)"
    assert update_entry()["off_policy"] is None
    assert update_entry(*SEPARATE)["note"].startswith("on-policy: ")  # k = 0: the same samples as colocated
    # Several mini-batches make an old-log-prob pass: no on-policy shortcut to name, but staleness is still named.
    assert actor_update_note(resolve(load_recipe(QUICKSTART, ["trainer.mini_batch_size=8"]))) == ""
    assert actor_update_note(resolve(load_recipe(QUICKSTART, [*SEPARATE, "trainer.max_staleness=1", "trainer.mini_batch_size=8"]))) == (
        "off-policy: samples up to 1 version old (trainer.max_staleness), no correction")
