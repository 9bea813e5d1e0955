"""validate on partial rollouts (rollout.partial.max_tokens_per_step): the staleness they need on each placement,
naming both keys, the rollouts that shape their own calls, a budget that carries nothing, the off-policy warning."""

from __future__ import annotations

import pytest

from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.check_partial import check_partial
from rlhfctl.recipe.off_policy import actor_update_note
from rlhfctl.recipe.resolved import resolve
from rlhfctl.recipe.validate import PPO_CHECKS
from tests.recipe.builders import validate_cli
from tests.recipe.test_check_importance import QUICKSTART, SEPARATE, issues

PARTIAL = "rollout.partial.max_tokens_per_step=8"
KEY = "rollout.partial.max_tokens_per_step"


def test_the_check_is_one_of_validates_ppo_checks():
    assert check_partial in PPO_CHECKS


def test_colocated_partial_rollouts_with_staleness_and_a_correction_are_valid_and_silent():
    assert issues(PARTIAL, "trainer.max_staleness=1", "rollout.importance_cap=2.0") == {}
    assert issues(PARTIAL, "trainer.max_staleness=1", "rollout.importance_cap=2.0", severity="warning") == {}
    assert issues(*SEPARATE, PARTIAL, "trainer.max_staleness=2", "rollout.importance_cap=2.0") == {}


@pytest.mark.parametrize("placement, given, least", [([], 0, 1), (SEPARATE, 1, 2)], ids=["colocated", "separate"])
def test_too_little_staleness_is_one_error_naming_both_keys(placement, given, least):
    found = issues(*placement, PARTIAL, f"trainer.max_staleness={given}", "rollout.importance_cap=2.0")
    assert list(found) == [KEY]
    assert found[KEY].startswith(f"{KEY}: 8 carries unfinished samples into the next step")
    assert f"trainer.max_staleness is {given}: every carried sample would be dropped; set trainer.max_staleness: {least} or more" in found[KEY]


@pytest.mark.parametrize("override, named", [
    ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.enable"),
    ("algorithm.adv_estimator=remax", "algorithm.adv_estimator"),
    ("rollout.multi_turn.enable=true", "rollout.multi_turn.enable"),
])
def test_rollouts_that_shape_their_own_calls_are_refused(override, named):
    found = issues(PARTIAL, "trainer.max_staleness=1", override)
    assert f"{KEY}: 8 cannot be combined with {named}" in found[KEY]


def test_stream_chunks_are_refused_on_a_rollout_group():
    found = issues(*SEPARATE, PARTIAL, "trainer.max_staleness=2", "rollout.stream_chunks=2")
    assert f"{KEY}: 8 cannot be combined with rollout.stream_chunks" in found[KEY]


def test_a_budget_not_below_max_new_tokens_warns_that_nothing_is_carried():
    found = issues("rollout.partial.max_tokens_per_step=24", "trainer.max_staleness=1", "rollout.importance_cap=2.0",
                   severity="warning")
    assert found[KEY].startswith(f"{KEY}: 24 is not below rollout.max_new_tokens: 24, so every sample finishes")


def test_without_a_correction_the_staleness_warning_names_partial_rollouts_and_the_dataflow_says_off_policy():
    found = issues(PARTIAL, "trainer.max_staleness=1", severity="warning")
    assert found["trainer.max_staleness"].startswith("trainer.max_staleness: 1 with rollout.partial trains the actor on "
                                                     "samples up to 1 policy version old, and no off-policy correction")
    recipe = resolve(load_recipe(QUICKSTART, [PARTIAL, "trainer.max_staleness=1", "rollout.importance_cap=2.0"]))
    assert actor_update_note(recipe).startswith("off-policy: samples up to 1 version old (trainer.max_staleness), "
                                                "corrected by rollout.importance_cap: 2.0")
    assert recipe.rollout.engine_log_probs


def test_the_cli_exits_2_with_the_message_and_no_traceback():
    result = validate_cli(QUICKSTART, PARTIAL)
    assert result.exit_code == 2
    assert f"{KEY}: 8 carries unfinished samples" in result.output


def test_the_memory_plan_sizes_a_segment_for_the_samples_carried_from_max_staleness_earlier_steps():
    from rlhfctl.recipe.memory_calls import generation_rows, rows_per_step, samples_per_step

    plain = resolve(load_recipe(QUICKSTART, []))
    partial = resolve(load_recipe(QUICKSTART, [PARTIAL, "trainer.max_staleness=2", "rollout.importance_cap=2.0"]))
    assert rows_per_step(plain) == samples_per_step(plain) == 64  # 16 prompts x 4
    assert rows_per_step(partial) == 64 * 3 and generation_rows(partial, 2) == 96


def test_the_dataflow_labels_the_generate_call_a_segment_with_its_budget():
    from rlhfctl.recipe.dataflow import training_step

    plain = training_step(resolve(load_recipe(QUICKSTART, [])))[0]
    generate = training_step(resolve(load_recipe(QUICKSTART, [PARTIAL, "trainer.max_staleness=1"])))[0]
    assert generate.method == "generate_sequences" and "segment" not in plain.note
    assert "continues from its prefix for at most 8 tokens (rollout.partial.max_tokens_per_step)" in generate.note
    assert "rollout_log_probs" in [tensor.name for tensor in generate.outputs]
