"""The resolved recipe: decided once, typed, read-only, and the same on a worker as on the driver."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.resolved import DEFAULT_INLINE_MODEL, resolve, resolve_mapping
from rlhfctl.recipe.schema import FrozenDict, FrozenList, ModelConfig

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SEPARATE = ["resource_pools.gen={process_on_nodes: [2], use_gpu: false}", "rollout.placement=separate", "rollout.pool=gen"]


def test_roles_carry_their_fallbacks_decided():
    recipe = resolve(load_recipe(RECIPES / "ppo-gae.yaml", ["trainer.ppo_epochs=3", "roles.critic.warmup_steps=2"]))
    assert list(recipe.roles) == ["actor", "reference", "critic", "reward"]
    actor, critic = recipe.role("actor"), recipe.role("critic")
    assert actor.settings.ppo_epochs == 3 and recipe.sections.roles.actor.ppo_epochs is None  # as written: null
    assert actor.update.ppo_epochs == 3 and actor.update.mini_batch_key == "trainer.mini_batch_size"
    assert critic.optim.warmup_steps == 2  # the critic's own warmup replaces its optimizer's
    assert critic.model == recipe.sections.roles.actor.model  # no model of its own: the actor's
    assert actor.settings.loss_scale_factor == recipe.rollout.response_width  # null: the response width
    assert actor.strategy == "ddp" and actor.world_size == 1 and actor.pool == "policy" and not actor.use_gpu
    assert recipe.step.needs_old_log_probs and recipe.step.reference_source == "reference"
    assert recipe.stage is None


def test_the_rollout_spec_says_who_generates_where():
    colocated = resolve(load_recipe(RECIPES / "quickstart.yaml"))
    assert not colocated.rollout.on_own_pool and colocated.rollout.pool is None
    separate = resolve(load_recipe(RECIPES / "quickstart.yaml", [*SEPARATE, "trainer.max_staleness=1"]))
    assert separate.rollout.on_own_pool and separate.rollout.pool == "gen" and separate.rollout.max_staleness == 1
    assert separate.pools["gen"].roles == ("rollout",) and separate.pools["gen"].world_size == 2


def test_the_resolved_recipe_is_read_only_all_the_way_down():
    recipe = resolve(load_recipe(RECIPES / "quickstart.yaml"))
    with pytest.raises(dataclasses.FrozenInstanceError, match="read-only"):
        recipe.trainer.seed = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.step = None  # type: ignore[misc]
    config = recipe.role("actor").model.config
    assert isinstance(config, FrozenDict) and isinstance(recipe.trainer.loggers, FrozenList)
    with pytest.raises(TypeError, match="read-only"):
        config["hidden_size"] = 8
    with pytest.raises(TypeError, match="read-only"):
        recipe.trainer.loggers.append("wandb")
    assert recipe.trainer["seed"] == recipe.trainer.get("seed") == 0  # sections read like mappings too


def test_a_worker_gets_the_same_recipe_it_was_sent():
    recipe = resolve(load_recipe(RECIPES / "dapo-quickstart.yaml"))
    copy = pickle.loads(pickle.dumps(recipe))
    assert copy.role("actor").settings == recipe.role("actor").settings and copy.step == recipe.step
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.trainer.seed = 1  # still sealed after the trip


def test_a_stage_without_an_actor_resolves_a_critic_without_a_model():
    """reward_model has no actor: a critic left in the recipe has nothing to fall back to (it used to crash)."""
    recipe = resolve(load_recipe(RECIPES / "reward-model-quickstart.yaml", ["roles.critic={}"]))
    assert recipe.stage == "reward_model" and "actor" not in recipe.roles
    assert recipe.role("critic").model is None
    assert recipe.role("reward").model is not None


def test_partial_data_takes_the_schemas_defaults_and_drops_nulls_the_schema_refuses():
    recipe = resolve_mapping({"trainer": {"mini_batch_size": None, "batch_size": 4}})
    assert recipe.trainer.mini_batch_size == 16 and recipe.trainer.batch_size == 4
    assert recipe.role("actor").model.config == DEFAULT_INLINE_MODEL
    assert resolve_mapping({}, role="critic").role("critic").model == ModelConfig(config=DEFAULT_INLINE_MODEL)
    with pytest.raises(KeyError, match="roles.critic is not configured"):
        resolve_mapping({}).role("critic")


def test_the_behaviour_loss_fact_sees_losses_registered_by_import_modules(tmp_path, monkeypatch):
    module = tmp_path / "behaviour_loss_for_resolve.py"
    module.write_text(
        "from rlhfctl.algorithms.policy_losses import register_policy_loss, POLICY_LOSSES\n"
        "register_policy_loss('behaviour_for_resolve', override=True)(\n"
        "    lambda old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, behaviour_log_prob=None,"
        " **kw: POLICY_LOSSES['vanilla'](old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    recipe = resolve(load_recipe(RECIPES / "quickstart.yaml", [
        "algorithm.import_modules=[behaviour_loss_for_resolve]", "roles.actor.policy_loss=behaviour_for_resolve"]))
    assert recipe.step.behaviour_loss
    assert not resolve(load_recipe(RECIPES / "quickstart.yaml")).step.behaviour_loss


def test_the_recipe_reads_like_the_mapping_workers_used_to_receive():
    recipe = resolve(load_recipe(RECIPES / "quickstart.yaml"))
    assert recipe["trainer"]["output_dir"] == recipe.trainer.output_dir
    assert recipe["roles"]["actor"]["ppo_epochs"] is None  # the section as written, not the resolved one
    assert recipe.get("nope", "default") == "default"
