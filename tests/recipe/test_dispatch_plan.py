"""build_dispatch_plan: roles with their registered methods, and the step's dataflow with per-rank shapes."""

from __future__ import annotations

import json

import pytest

from rlhfctl.recipe import RecipeError, load_recipe
from rlhfctl.recipe.dispatch_plan import build_dispatch_plan
from rlhfctl.recipe.resolved import resolve
from tests.recipe.builders import STUB


def _plan(path, *overrides, batch_size=None):
    return build_dispatch_plan(resolve(load_recipe(path, list(overrides))), batch_size=batch_size)


def _calls(plan) -> dict:
    return {entry["call"]: entry for entry in plan["dataflow"]}


def test_roles_describe_classes_pools_and_methods(recipe_file):
    plan = json.loads(json.dumps(_plan(recipe_file)))  # JSON-ready
    actor = plan["roles"]["actor"]
    assert actor["class"] == f"{STUB}.StubActor" and actor["pool"] == "main"
    assert actor["world_size"] == 2 and actor["ranks"] == [0, 1]
    assert actor["colocated_with"] == ["reference", "reward"]
    assert actor["methods"]["generate_sequences"] == {
        "dispatch_mode": "ALL_TO_ALL", "execute_mode": "ALL", "blocking": True, "materialize_futures": True}
    assert actor["methods"]["export"]["execute_mode"] == "RANK_ZERO" and actor["methods"]["export"]["blocking"] is False
    assert actor["missing_methods"] == []
    assert set(plan["roles"]) == {"actor", "reference", "reward"}
    assert plan["format_version"] == 1 and plan["batch"] == {
        "prompts": 16, "n": 4, "samples": 64, "prompt_length": 32, "response_length": 32}


def test_dataflow_order_and_shapes_on_two_ranks(recipe_file):
    plan = _plan(recipe_file)
    assert [entry["call"] for entry in plan["dataflow"]] == [
        "actor.generate_sequences", "reward.compute_rewards", "reference.compute_ref_log_prob",
        "driver: compute_advantages", "actor.update_actor"]
    generate = _calls(plan)["actor.generate_sequences"]
    assert generate["summary"] == "16 prompts -> 2 ranks x 8 (-> 64 samples)"
    assert generate["rows_per_rank"] == 8 and generate["out_rows_per_rank"] == 32 and generate["rows_out"] == 64
    outputs = {t["name"]: t for t in generate["outputs"]}
    assert outputs["responses"] == {"name": "responses", "shape": [32, 32], "dtype": "int64"}
    assert outputs["input_ids"]["shape"] == [32, 64]
    assert {t["name"]: t["shape"] for t in generate["inputs"]}["input_ids"] == [8, 32]
    driver = _calls(plan)["driver: compute_advantages"]
    assert driver["kind"] == "driver" and "grpo" in driver["purpose"]
    assert {t["name"]: t["shape"] for t in driver["outputs"]}["advantages"] == [64, 32]


def test_padding_rows_on_three_ranks(recipe_file):
    plan = _plan(recipe_file, "resource_pools.main.process_on_nodes=[3]")
    reward = _calls(plan)["reward.compute_rewards"]
    assert reward["summary"] == "64 samples -> 3 ranks x 22 (2 padding rows)"
    assert reward["padding_rows"] == 2 and reward["rows_per_rank"] == 22
    assert {t["name"]: t["shape"] for t in reward["outputs"]}["token_level_scores"] == [22, 32]
    generate = _calls(plan)["actor.generate_sequences"]
    assert generate["summary"] == "16 prompts -> 3 ranks x 6 (2 padding rows) (-> 64 samples)"


def test_batch_size_option_changes_the_shapes(recipe_file):
    plan = _plan(recipe_file, batch_size=4)
    generate = _calls(plan)["actor.generate_sequences"]
    assert generate["summary"] == "4 prompts -> 2 ranks x 2 (-> 16 samples)"
    assert {t["name"]: t["shape"] for t in generate["outputs"]}["responses"] == [8, 32]


def test_lora_without_reference_uses_the_actor(recipe_file):
    plan = _plan(recipe_file, "roles.actor.lora={r: 4}", "~roles.reference")
    calls = _calls(plan)
    assert "actor.compute_ref_log_prob" in calls and "reference.compute_ref_log_prob" not in calls
    assert "adapter disabled" in calls["actor.compute_ref_log_prob"]["note"]
    assert "reference" not in plan["roles"]


def test_critic_gae_and_in_reward_kl(recipe_file):
    plan = _plan(recipe_file, "algorithm.adv_estimator=gae", f"roles.critic.worker={STUB}.StubCritic",
                 "algorithm.kl.use_in_reward=true", "trainer.mini_batch_size=8", "trainer.critic_warmup_steps=2")
    order = [entry["call"] for entry in plan["dataflow"]]
    assert order == [
        "actor.generate_sequences", "reward.compute_rewards", "reference.compute_ref_log_prob", "critic.compute_values",
        "actor.compute_log_prob", "driver: apply_kl_penalty", "driver: compute_advantages", "critic.update_critic",
        "actor.update_actor"]
    update = _calls(plan)["actor.update_actor"]
    assert update["update"]["mini_batches"] == 2 and update["update"]["grad_accum_steps"] == 1
    assert "critic_warmup_steps" in update["note"]
    assert "values" in {t["name"] for t in _calls(plan)["driver: compute_advantages"]["inputs"]}


def test_unregistered_method_is_marked(recipe_file):
    plan = _plan(recipe_file, f"roles.actor.worker={STUB}.StubActorNoRef")
    update = _calls(plan)["actor.update_actor"]
    assert update["registered"] is False and update["dispatch_mode"] is None
    assert plan["roles"]["actor"]["missing_methods"] == ["update_actor"]


def test_unimportable_worker_raises_recipe_error(recipe_file):
    with pytest.raises(RecipeError) as caught:
        _plan(recipe_file, "roles.reward.worker=nowhere.Reward")
    assert caught.value.key_path == "roles.reward.worker"


def test_every_dataflow_entry_has_the_same_keys(recipe_file):
    plan = _plan(recipe_file, "algorithm.adv_estimator=gae", f"roles.critic.worker={STUB}.StubCritic",
                 "algorithm.kl.use_in_reward=true", "trainer.mini_batch_size=8")
    common = {"index", "call", "kind", "role", "method", "purpose", "note", "unit", "rows_in", "dispatch_mode",
              "execute_mode", "blocking", "materialize_futures", "registered", "world_size", "ranks", "rows_per_rank",
              "padding_rows", "rows_out", "out_rows_per_rank", "inputs", "outputs", "summary", "pool"}
    for entry in plan["dataflow"]:
        assert common <= set(entry), entry["call"]
        assert ("update" in entry) == entry["call"].startswith(("actor.update", "critic.update"))


def test_remax_adds_the_greedy_baseline(recipe_file):
    calls = [entry["call"] for entry in _plan(recipe_file, "algorithm.adv_estimator=remax")["dataflow"]]
    assert calls.count("actor.generate_sequences") == 2 and calls.count("reward.compute_rewards") == 2
