"""validate on rollout.importance_mask (masked importance sampling) beside rollout.importance_cap: the band's order
and bounds, the policy losses that take the behaviour log-probs themselves, a rollout without behaviour log-probs,
and the staleness warning a mask silences."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfctl.recipe import load_recipe, validate_recipe
from rlhfctl.recipe.check_importance import check_importance_correction
from rlhfctl.recipe.off_policy import actor_update_note, off_policy_corrections
from rlhfctl.recipe.resolved import resolve
from rlhfctl.recipe.validate import PPO_CHECKS
from tests.recipe.builders import validate_cli

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
SEPARATE = ["resource_pools.gen={process_on_nodes: [1], use_gpu: false}", "rollout.placement=separate", "rollout.pool=gen"]
MASK = "rollout.importance_mask=[0.5,2.0]"


def issues(*overrides: str, severity: str = "error") -> dict[str, str]:
    """key path -> message of the report's issues of ``severity`` for the quickstart with ``overrides``."""
    report = validate_recipe(load_recipe(QUICKSTART, list(overrides)))
    return {issue.key_path: issue.message for issue in report.issues if issue.severity == severity}


def test_the_check_is_one_of_validates_ppo_checks():
    assert check_importance_correction in PPO_CHECKS


def test_a_band_with_a_rollout_group_of_its_own_is_valid_and_silent():
    assert issues(*SEPARATE, MASK) == {}
    assert issues(*SEPARATE, MASK, severity="warning") == {}
    assert issues(*SEPARATE, MASK, "rollout.importance_cap=1.5") == {}  # both: the kept tokens are truncated too


@pytest.mark.parametrize("band, message", [
    ("[2.0,0.5]", "rollout.importance_mask: [low, high] needs low < high, got [2.0, 0.5]"),
    ("[1.0,1.0]", "rollout.importance_mask: [low, high] needs low < high, got [1.0, 1.0]"),
    ("[-0.5,2.0]", "rollout.importance_mask[0]: must be >= 0, got -0.5"),
    ("[0.5]", "rollout.importance_mask: needs exactly 2 item(s), got 1"),
])
def test_a_band_out_of_order_below_0_or_of_one_bound_exits_2_naming_the_key(band, message):
    result = validate_cli(QUICKSTART, *SEPARATE, f"rollout.importance_mask={band}")
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


@pytest.mark.parametrize("key", ["rollout.importance_mask=[0.5,2.0]", "rollout.importance_cap=2.0"])
def test_either_correction_with_decoupled_ppo_exits_2_naming_its_key(key):
    result = validate_cli(QUICKSTART, *SEPARATE, "roles.actor.policy_loss=decoupled_ppo", key)
    assert result.exit_code == 2, result.output
    path = key.split("=")[0]
    what = "masked" if "mask" in path else "truncated"
    assert (f"{path}: policy_loss decoupled_ppo takes the behaviour log-probs and weighs each token by proximal / "
            f"behaviour probability already; {what} importance sampling would weigh it twice") in " ".join(result.output.split())


def test_masked_is_with_a_custom_loss_that_takes_behaviour_log_probs_exits_2():
    """validate reads the actor's own rule (the loss's signature), not decoupled_ppo's name."""
    result = validate_cli(QUICKSTART, *SEPARATE, "algorithm.import_modules=[tests.recipe.custom_behaviour_loss]",
                          "roles.actor.policy_loss=test_behaviour_weighted", MASK)
    assert result.exit_code == 2
    assert "rollout.importance_mask: policy_loss test_behaviour_weighted takes the behaviour log-probs" in result.stderr


def test_without_behaviour_log_probs_either_correction_is_a_warning_that_it_has_no_effect():
    warned = issues(MASK, "rollout.importance_cap=2.0", severity="warning")  # the colocated hf actor
    for key in ("rollout.importance_mask", "rollout.importance_cap"):
        assert warned[key] == f"{key}: has no effect with rollout.engine: hf (the actor samples and scores with the same weights and code)"
    assert issues(MASK) == {}


def test_a_band_is_an_off_policy_correction_that_silences_the_staleness_warning():
    stale = [*SEPARATE, "trainer.max_staleness=1"]
    assert "trainer.max_staleness" in issues(*stale, severity="warning")
    assert "trainer.max_staleness" not in issues(*stale, MASK, severity="warning")
    recipe = resolve(load_recipe(QUICKSTART, [*stale, MASK, "rollout.importance_cap=2.0"]))
    assert off_policy_corrections(recipe) == ["rollout.importance_cap: 2.0", "rollout.importance_mask: [0.5, 2.0]"]
    assert "corrected by rollout.importance_cap: 2.0 and rollout.importance_mask: [0.5, 2.0]" in actor_update_note(recipe)
