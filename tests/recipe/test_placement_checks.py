"""validate and inspect-dispatch with rollout.placement: separate (a rollout group on a pool of its own) and staleness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app
from rlhfctl.recipe import load_recipe, validate_recipe
from tests.recipe.builders import validate_cli

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
QUICKSTART = RECIPES / "quickstart.yaml"
SEPARATE = ["resource_pools.gen={process_on_nodes: [2], use_gpu: false}", "rollout.placement=separate", "rollout.pool=gen"]


def issues(*overrides: str, recipe: Path = QUICKSTART, severity: str = "error") -> dict[str, str]:
    """key path -> message of the report's issues of ``severity`` for ``recipe`` with ``overrides``."""
    report = validate_recipe(load_recipe(recipe, list(overrides)))
    return {issue.key_path: issue.message for issue in report.issues if issue.severity == severity}


def test_a_separate_rollout_group_on_its_own_pool_validates_and_is_a_role_of_that_pool():
    report = validate_recipe(load_recipe(QUICKSTART, SEPARATE))
    assert report.errors == []
    assert report.pools["gen"].roles == ("rollout",)
    assert "rollout" not in report.pools["main"].roles
    assert not any(issue.key_path == "resource_pools.gen" for issue in report.issues)  # the pool is used
    shards = {row.call: row for row in report.batch.shards}
    assert shards["rollout.generate_sequences"].pool == "gen" and shards["rollout.generate_sequences"].world_size == 2
    assert "actor.generate_sequences" not in shards and "actor.send_weights" not in shards  # a sync has no rows


def test_staleness_with_a_colocated_rollout_names_the_placement_to_set():
    message = issues("trainer.max_staleness=2")["trainer.max_staleness"]
    assert "rollout.placement: separate" in message and "rollout.pool" in message
    assert "trainer.max_staleness" not in issues(*SEPARATE, "trainer.max_staleness=2")


@pytest.mark.parametrize(("pool", "says"), [("null", "rollout.pool: is null"), ("gne", "did you mean 'gen'?")])
def test_a_separate_rollout_needs_a_declared_pool_and_lists_the_pools(pool, says):
    message = issues(*SEPARATE, f"rollout.pool={pool}")["rollout.pool"]
    assert says in message and "(declared: main, gen)" in message


def test_the_rollout_pool_may_host_no_other_role():
    message = issues(*SEPARATE, "rollout.pool=main")["rollout.pool"]
    assert "main also hosts actor, reference, reward" in message and "to itself" in message


def test_a_separate_rollout_needs_the_ray_backend_for_the_weight_sync():
    message = issues(*SEPARATE, "ray.backend=local")["rollout.placement"]
    assert "ray.backend: local" in message and "use ray.backend: ray" in message


def test_a_separate_rollout_is_for_the_ppo_loop_only():
    message = issues("rollout.placement=separate", "rollout.pool=main", recipe=RECIPES / "sft-quickstart.yaml")["rollout.placement"]
    assert "algorithm.name is sft" in message


def test_each_stream_chunk_splits_evenly_over_the_rollout_ranks():
    message = issues(*SEPARATE, "rollout.stream_chunks=3")["rollout.stream_chunks"]
    assert "trainer.batch_size 16 is not divisible by stream_chunks 3 x 2 rollout rank(s)" in message
    assert issues(*SEPARATE, "rollout.stream_chunks=4") == {}


def test_dynamic_sampling_runs_on_a_rollout_group():
    assert issues(*SEPARATE, "algorithm.filter_groups.enable=true", "trainer.max_staleness=1") == {}


def test_agent_rollouts_run_on_a_rollout_group():
    agent = ("rollout.multi_turn.enable=true", "rollout.multi_turn.max_response_tokens=64")
    assert issues(*SEPARATE, *agent, "trainer.max_staleness=1") == {}


def test_a_separate_hf_rollout_returns_behaviour_log_probs_so_importance_correction_is_accepted():
    assert "rollout.importance_cap" in issues("rollout.importance_cap=2.0", severity="warning")  # colocated hf: no effect
    assert issues(*SEPARATE, "rollout.importance_cap=2.0", severity="warning") == {}
    assert issues(*SEPARATE, "rollout.importance_cap=2.0") == {}
    assert issues(*SEPARATE, "roles.actor.policy_loss=decoupled_ppo") == {}
    assert issues(*SEPARATE, "algorithm.adv_estimator=remax") == {}  # the greedy baseline is generated there too


def test_the_rollout_pool_counts_among_the_pools_that_must_fit():
    cpus = issues(*SEPARATE, "resource_pools.gen.process_on_nodes=[4]", "ray.num_cpus=1")["ray.num_cpus"]
    assert "the pools reserve 2.5 CPUs" in cpus and "gen 2 for rollout.pool" in cpus
    gpus = issues(*SEPARATE, "resource_pools.gen.use_gpu=true", "ray.num_gpus=0")["ray.num_gpus"]
    assert "gen 2 for rollout.pool" in gpus


@pytest.mark.parametrize(("gen_gpu", "main_gpu"), [("true", "false"), ("false", "true")])
def test_the_rollout_pool_and_the_actors_use_the_same_device_kind(gen_gpu, main_gpu):
    found = issues(*SEPARATE, f"resource_pools.gen.use_gpu={gen_gpu}", f"resource_pools.main.use_gpu={main_gpu}",
                   "ray.num_gpus=8", "ray.num_cpus=8")
    where = {"true": "GPUs", "false": "CPUs"}
    assert found == {"rollout.pool": (
        f"rollout.pool: gen runs on {where[gen_gpu]} (use_gpu: {gen_gpu}) but the actor's pool main on {where[main_gpu]}; "
        "the weight channel between them is one process group (NCCL on GPUs, gloo on CPUs), so set "
        "resource_pools.<pool>.use_gpu the same on both pools")}
    both = ("resource_pools.gen.use_gpu=true", "resource_pools.main.use_gpu=true", "ray.num_gpus=8", "ray.num_cpus=8")
    assert issues(*SEPARATE, *both) == {}


def test_the_rollout_worker_must_import_and_register_the_group_methods():
    assert "rollout.worker" in issues(*SEPARATE, "rollout.worker=workers.nowhere.Rollout")
    message = issues(*SEPARATE, "rollout.worker=workers.reward.RewardWorker")["rollout.worker"]
    assert "lacks registered method(s) join_weight_sync, receive_weights, generate_sequences, sync_probe" in message


def test_validate_cli_exits_2_naming_the_rollout_pool():
    result = validate_cli(QUICKSTART, *SEPARATE, "rollout.pool=main")
    assert result.exit_code == 2, result.output
    assert "rollout.pool: main also hosts actor" in result.output


def test_inspect_dispatch_shows_the_rollout_group_and_the_weight_sync():
    result = CliRunner().invoke(app, ["inspect-dispatch", str(QUICKSTART), *SEPARATE, "--format", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    rollout = plan["roles"]["rollout"]
    assert rollout["worker"] == "workers.rollout_worker.RolloutWorker" and rollout["pool"] == "gen"
    assert rollout["world_size"] == 2 and rollout["colocated_with"] == []
    calls = [entry["call"] for entry in plan["dataflow"]]
    assert "actor.generate_sequences" not in calls
    assert calls[0] == "rollout.generate_sequences" and calls[-3:] == ["actor.update_actor", "actor.send_weights", "rollout.receive_weights"]
    generate, receive = plan["dataflow"][0], plan["dataflow"][-1]
    assert (generate["pool"], generate["world_size"], generate["rows_per_rank"]) == ("gen", 2, 8)
    assert "rollout_log_probs" in [tensor["name"] for tensor in generate["outputs"]]
    assert receive["purpose"] == "weight sync: actor rank 0 broadcasts to the rollout ranks" and receive["rows_in"] == 0
    table = CliRunner().invoke(app, ["inspect-dispatch", str(QUICKSTART), *SEPARATE, "--role", "rollout"])
    assert table.exit_code == 0, table.output
    assert "rollout.receive_weights" in table.stdout and "[gen]" in table.stdout


@pytest.mark.parametrize("placement", [[], SEPARATE])
def test_inspect_dispatch_says_when_dynamic_sampling_generates_again(placement):
    def generation_note(*overrides: str) -> str:
        result = CliRunner().invoke(app, ["inspect-dispatch", str(QUICKSTART), *placement, *overrides, "--format", "json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["dataflow"][0]["note"]

    assert "filter_groups" not in generation_note()
    note = generation_note("algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=3")
    assert "repeated with its scoring on more prompts until trainer.batch_size groups differ in acc, at most 3 calls a step" in note
    assert ("queues behind the batches in flight" in note) == bool(placement)
