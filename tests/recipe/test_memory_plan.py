"""The memory plan: shown by validate, sharding arithmetic, and within 5% of the state measured every step."""

from __future__ import annotations

import json

import pytest
import torch

from rlhfctl.cli.app import app
from rlhfctl.protocol import DataProto
from rlhfctl.recipe import load_recipe, validate_recipe
from rlhfctl.recipe.memory_plan import parse_bytes, plan_memory
from rlhfctl.recipe.pools import PoolInfo
from rlhfctl.recipe.resolved import resolve_mapping
from rlhfctl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.recipe.builders import recipe_data, write_recipe
from tests.workers.conftest import local_group
from tests.workers.recipes import digits_prompts, tiny_recipe
from tests.workers.test_actor import with_advantages
from workers import ActorWorker, CriticWorker

GIB = 2**30


def pools(world: int, *roles: str) -> dict[str, PoolInfo]:
    return {"global": PoolInfo("global", roles, (world,), False, 4, None)}


def planned(recipe, world: int, role: str) -> float:
    """The plan's largest-rank state of ``role``, in GiB."""
    plan = plan_memory(resolve_mapping(recipe), pools(world, "actor", "critic", "reward"))
    return next(item for item in plan.roles if item.role == role).largest.state_bytes / GIB


def test_validate_shows_the_plan_in_json_and_compares_with_the_device(tmp_path):
    from typer.testing import CliRunner

    path = write_recipe(tmp_path, recipe_data())
    result = CliRunner().invoke(app, ["validate", str(path), "--format", "json", "--device-memory", "1GiB"])
    assert result.exit_code == 0, result.output
    memory = json.loads(result.stdout)["memory"]
    roles = {role["role"]: role for role in memory["roles"]}
    assert set(roles) == {"actor", "reference"}
    actor, reference = roles["actor"], roles["reference"]
    assert actor["strategy"] == "fsdp2" and actor["world_size"] == 2 and len(actor["ranks"]) == 2
    rank0 = actor["ranks"][0]
    assert rank0["optimizer_bytes"] == 2 * rank0["grad_bytes"] > 0 and rank0["kv_cache_bytes"] > 0
    assert reference["ranks"][0]["grad_bytes"] == 0 and reference["ranks"][0]["optimizer_bytes"] == 0
    assert memory["device_memory"] == GIB and memory["device_source"] == "--device-memory"
    peak = memory["peak"]["main"]
    assert memory["process_bytes"]["main"] == peak["bytes"]
    peak_terms = next(phase["terms"] for phase in memory["phases"]["main"]
                      if (phase["call"], phase["rank"]) == (peak["call"], peak["rank"]))
    state = {term["name"]: term["bytes"] for term in peak_terms if term["kind"] == "state"}
    assert state == {"actor weights": rank0["param_bytes"], "actor optimizer": rank0["optimizer_bytes"],
                     "reference weights": reference["ranks"][0]["param_bytes"]}
    table = CliRunner().invoke(app, ["validate", str(path), "--device-memory", "1GiB"])
    assert "Memory plan: state per rank" in table.stdout and "of 1.00 GiB" in table.stdout


def test_a_token_budget_below_one_row_exits_2_naming_the_key(tmp_path):
    from typer.testing import CliRunner

    path = write_recipe(tmp_path, recipe_data())
    result = CliRunner().invoke(app, ["validate", str(path), "roles.actor.micro_batch_tokens=40"])
    assert result.exit_code == 2
    assert ("roles.actor.micro_batch_tokens: 40 is smaller than one sequence (64 tokens = data.max_prompt_length 32 "
            "+ rollout.max_new_tokens 32)") in result.output
    assert "Traceback" not in result.output
    ok = validate_recipe(load_recipe(path, ["roles.actor.micro_batch_tokens=64"]))
    assert ok.ok, ok.errors
    bad_size = CliRunner().invoke(app, ["validate", str(path), "--device-memory", "lots"])
    assert bad_size.exit_code == 2 and "--device-memory" in bad_size.output


def test_sharding_splits_every_tensor_by_rows_and_kv_cache_follows_the_formula():
    recipe = tiny_recipe(data={"max_prompt_length": 10}, rollout={"n": 2, "max_new_tokens": 6}, trainer={"batch_size": 4})
    replica = plan_memory(resolve_mapping(recipe), pools(1, "actor")).roles[0]
    sharded = plan_memory(resolve_mapping(recipe), pools(2, "actor")).roles[0]
    offloaded = plan_memory(resolve_mapping(tiny_recipe(roles={"actor": {"fsdp": {"cpu_offload": True}}})), pools(2, "actor")).roles[0]
    assert sharded.strategy == "fsdp2" and replica.strategy == "ddp"
    assert sum(rank.state_bytes for rank in sharded.ranks) == replica.ranks[0].state_bytes
    assert sharded.largest.state_bytes <= 0.51 * replica.ranks[0].state_bytes
    assert replica.ranks[0].state_bytes == replica.parameters * (4 + 4 + 8)  # fp32 master + grad + two moments
    # 8 rows x 16 tokens x 2 layers x 2 kv heads x 16 head dim x (k, v) x 4 bytes
    assert replica.ranks[0].kv_cache_bytes == 8 * 16 * 2 * 2 * 16 * 2 * 4
    assert offloaded.ranks[0].device_bytes == offloaded.ranks[0].kv_cache_bytes
    assert parse_bytes("80GiB") == 80 * GIB and parse_bytes("1.5GB") == 1_500_000_000
    with pytest.raises(ValueError, match="80GiB"):
        parse_bytes("80 gigs")


def test_the_plan_is_within_5_percent_of_the_measured_state_on_one_rank():
    recipe = tiny_recipe(roles={"critic": {}, "actor": {"micro_batch_size": 2}})
    with local_group(ActorWorker, recipe, "actor") as actor, local_group(CriticWorker, recipe, "critic") as critic:
        batch = with_advantages(actor.generate_sequences(digits_prompts(4)))
        (metrics,) = actor.update_actor(batch)
        values = critic.compute_values(batch)
        returns = DataProto.from_dict({"returns": torch.ones_like(values.batch["values"])})
        (critic_metrics,) = critic.update_critic(batch.union(values).union(returns))
    assert metrics["memory/actor/state_gib"] == pytest.approx(planned(recipe, 1, "actor"), rel=0.05)
    assert critic_metrics["memory/critic/state_gib"] == pytest.approx(planned(recipe, 1, "critic"), rel=0.05)


def test_the_plan_is_within_5_percent_of_the_measured_state_under_ddp_with_token_budgets(ray_session):
    # micro_batch_tokens: each rank forms its own micro-batches; they run as many, so DDP does not hang.
    recipe = tiny_recipe(roles={"actor": {"strategy": "ddp", "micro_batch_tokens": 40}})
    pool = RayResourcePool([2], name="memory-ddp")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ActorWorker, recipe, "actor"))
    try:
        group.init_model()
        batch = with_advantages(group.generate_sequences(digits_prompts(4)))
        metrics = group.update_actor(batch)
        assert metrics[0] == metrics[1]
        after = group.state_fingerprint()
        assert after[0] == pytest.approx(after[1], abs=1e-9, rel=0)
    finally:
        group.shutdown()
    assert metrics[0]["memory/actor/state_gib"] == pytest.approx(planned(recipe, 2, "actor"), rel=0.05)


def test_a_hub_model_that_is_not_cached_is_skipped_without_a_download(tmp_path, monkeypatch):
    """The plan reads configs from local directories or the HF cache only; a hub id it cannot see is skipped."""
    import time

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    recipe = tiny_recipe(roles={"actor": {"model": {"path": "some-org/not-downloaded"}}})
    started = time.perf_counter()
    plan = plan_memory(resolve_mapping(recipe), pools(1, "actor"))
    assert time.perf_counter() - started < 20
    assert "actor" in plan.skipped and "neither a local directory nor in the Hugging Face cache" in plan.skipped["actor"]
    assert [role.role for role in plan.roles] == []
