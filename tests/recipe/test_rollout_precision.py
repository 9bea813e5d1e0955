"""rollout.dtype: resolved once (null: the actor's compute dtype), warned about without an off-policy correction, and
shown in the dataflow (the engine's behaviour log-probs reach the update)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfctl.recipe import load_recipe, validate_recipe
from rlhfctl.recipe.check_rollout_precision import check_rollout_precision
from rlhfctl.recipe.dataflow import training_step
from rlhfctl.recipe.resolved import resolve
from rlhfctl.recipe.validate import PPO_CHECKS
from tests.recipe.builders import validate_cli

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
WARNING = ("rollout.dtype: bfloat16 differs from roles.actor.model.dtype: float32, so the engine samples from a slightly "
           "different policy than the one the actor scores and trains, and no off-policy correction is set; add one: "
           "rollout.importance_cap: 2.0 (truncated importance sampling, the policy loss unchanged) or "
           "roles.actor.policy_loss: decoupled_ppo (optionally capped by roles.actor.behav_imp_weight_cap); or set "
           "rollout.dtype: null (the actor's dtype). rollout/logprob_diff logs the gap each step")


def _recipe(*overrides: str):
    return resolve(load_recipe(QUICKSTART, list(overrides)))


def _warnings(*overrides: str) -> dict[str, str]:
    report = validate_recipe(load_recipe(QUICKSTART, list(overrides)))
    assert report.errors == [], report.errors
    return {issue.key_path: issue.message for issue in report.warnings}


@pytest.mark.parametrize(("overrides", "dtype", "own"), [
    ((), "float32", False),
    (("rollout.dtype=bfloat16",), "bfloat16", True),
    (("rollout.dtype=fp32",), "fp32", False),
    (("roles.actor.model.dtype=bf16",), "bf16", False),
    (("roles.actor.model.dtype=bf16", "rollout.dtype=bfloat16"), "bfloat16", False),
    (("roles.actor.model.dtype=auto", "rollout.dtype=float32"), "float32", False),
    (("roles.actor.model.dtype=bf16", "rollout.dtype=float32"), "float32", True),
])
def test_the_rollout_dtype_falls_back_to_the_actors_and_is_apart_only_in_another_precision(overrides, dtype, own):
    rollout = _recipe(*overrides).rollout
    assert (rollout.dtype, rollout.own_precision) == (dtype, own)
    assert rollout.engine_log_probs is own  # the colocated hf engine returns log-probs only in a precision of its own


def test_validate_warns_naming_both_keys_and_exits_0():
    assert check_rollout_precision in PPO_CHECKS
    assert _warnings("rollout.dtype=bfloat16")["rollout.dtype"] == WARNING
    result = validate_cli(QUICKSTART, "rollout.dtype=bf16")
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "rollout.dtype: bf16 differs from roles.actor.model.dtype: float32" in flat


@pytest.mark.parametrize("overrides", [("rollout.dtype=float32",), ("rollout.dtype=bf16", "rollout.importance_cap=2.0"),
                                       ("rollout.dtype=bf16", "roles.actor.policy_loss=decoupled_ppo")])
def test_the_same_precision_or_a_correction_gets_no_warning(overrides):
    assert "rollout.dtype" not in _warnings(*overrides)


def test_the_importance_cap_takes_effect_with_an_hf_engine_in_its_own_precision():
    assert "rollout.importance_cap" in _warnings("rollout.importance_cap=2.0")  # no behaviour log-probs to weigh by
    assert "rollout.importance_cap" not in _warnings("rollout.dtype=bf16", "rollout.importance_cap=2.0")


def test_the_dataflow_returns_the_engines_log_probs_to_the_update():
    steps = {call.method: call for call in training_step(_recipe("rollout.dtype=bf16"))}
    assert "rollout_log_probs" in [field.name for field in steps["generate_sequences"].outputs]
    assert "rollout_log_probs" in [field.name for field in steps["update_actor"].inputs]
    assert steps["generate_sequences"].note.endswith("sampled in bf16 (rollout.dtype), behaviour log-probs returned")
    today = {call.method: call for call in training_step(_recipe())}
    assert "rollout_log_probs" not in [field.name for field in today["update_actor"].inputs]


def _plan(*overrides: str):
    from rlhfctl.recipe.memory_plan import plan_memory
    from rlhfctl.recipe.pools import resolve_pools

    cfg = load_recipe(QUICKSTART, list(overrides))
    return plan_memory(resolve(cfg), resolve_pools(cfg), None)


def test_the_memory_plan_holds_the_hf_engines_copy_and_kv_cache_in_rollout_dtype():
    today, bf16 = _plan(), _plan("rollout.dtype=bf16")
    actor = next(role for role in bf16.roles if role.role == "actor")
    generate, update = (bf16.phase_terms("main")[call] for call in ("actor.generate_sequences", "actor.update_actor"))
    before = today.phase_terms("main")["actor.generate_sequences"]
    assert generate["actor rollout copy"] == update["actor rollout copy"] == actor.parameters * 2  # kept between rollouts
    assert "actor rollout copy" not in before
    assert generate["actor KV cache"] * 2 == before["actor KV cache"]  # bf16 keys and values, half of float32's
    assert generate["actor activations"] * 2 == before["actor activations"]


def test_the_memory_plan_builds_the_rollout_groups_replica_in_rollout_dtype():
    separate = ("resource_pools.gen={process_on_nodes: [1], use_gpu: false}", "rollout.placement=separate", "rollout.pool=gen")
    today, bf16 = _plan(*separate), _plan(*separate, "rollout.dtype=bf16")
    before, after = (plan.phase_terms("gen")["rollout.generate_sequences"]["rollout weights"] for plan in (today, bf16))
    assert after * 2 == before
    rollout = next(role for role in bf16.roles if role.role == "rollout")
    assert rollout.param_dtype == "bf16" and "rollout.dtype" in rollout.note
