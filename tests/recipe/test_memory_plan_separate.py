"""The memory plan with rollout.placement: separate: the rollout pool's engine and received bucket, the actor's pool
without generation but with its send bucket, and the warnings naming the rollout pool's knobs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlhfctl.cli.app import app
from rlhfctl.recipe import load_recipe, validate_recipe
from rlhfctl.recipe.memory_plan import CONTEXT_BYTES, LOGIT_FP32_COPIES, plan_memory
from rlhfctl.recipe.pools import PoolInfo, resolve_pools
from rlhfctl.recipe.resolved import resolve, resolve_mapping
from tests.recipe.builders import PARAMETERS_7B
from tests.workers.recipes import tiny_recipe

GIB, MIB = 2**30, 2**20
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "colocated-8gpu.yaml"
#: GRPO with actor + reference on 4 GPUs of pool main, generation on 4 GPUs of pool gen.
SPLIT = ["algorithm.adv_estimator=grpo", "roles.critic=null", "resource_pools.main.process_on_nodes=[4]"]
SEPARATE = ["resource_pools.gen={process_on_nodes: [4], use_gpu: true}", "rollout.placement=separate", "rollout.pool=gen"]
# Qwen2.5-7B's sizes: its embedding and untied head (152064 x 3584) are its largest tensors.
EMBEDDING = 152064 * 3584
ROWS, PROMPT, LENGTH = 128 * 2 // 4, 256, 256 + 256  # 256 samples over 4 rollout ranks; prompt + response tokens


def overrides(qwen_7b: Path, *extra: str) -> list[str]:
    return [f"roles.actor.model.path={qwen_7b / 'model'}", f"data.train_files=[{qwen_7b / 'train.jsonl'}]", *SPLIT, *extra]


def plan(qwen_7b: Path, *extra: str, device_memory: int = 80 * GIB):
    """The plan of colocated-8gpu with the 7B model, ``extra`` overrides, on its resolved pools."""
    cfg = load_recipe(RECIPE, overrides(qwen_7b, *extra))
    return plan_memory(resolve(cfg), resolve_pools(cfg), device_memory)


def bucket_7b() -> int:
    """One sync bucket of the 7B model: its embedding in bf16, larger than the default 256 MiB sync_bucket_mib."""
    assert EMBEDDING * 2 > 256 * MIB
    return EMBEDDING * 2


def test_an_hf_rollout_pool_holds_a_bf16_replica_its_kv_cache_and_one_received_bucket(qwen_7b):
    memory = plan(qwen_7b, *SEPARATE, "rollout.engine=hf")
    rollout = next(role for role in memory.roles if role.role == "rollout")
    assert (rollout.pool, rollout.world_size, rollout.strategy, rollout.trainable) == ("gen", 4, "ddp", False)
    assert [rank.optimizer_bytes for rank in rollout.ranks] == [0] * 4 and rollout.parameters == PARAMETERS_7B
    terms = memory.phase_terms("gen")
    assert list(terms) == ["rollout.generate_sequences", "rollout.receive_weights"]
    generate, receive = terms["rollout.generate_sequences"], terms["rollout.receive_weights"]
    kv = ROWS * LENGTH * 28 * (4 * 128) * 2 * 2  # rows x tokens x layers x KV width x (k, v) x bf16
    assert generate == {
        "CUDA context + NCCL": CONTEXT_BYTES,
        "rollout weights": PARAMETERS_7B * 2,  # a whole bf16 replica on every rank, nothing gathered
        "rollout KV cache": kv,
        "rollout activations": ROWS * PROMPT * (4 * 3584 + 3 * 18944) * 2,
        "rollout logits": ROWS * 152064 * 4 * LOGIT_FP32_COPIES,
    }
    assert receive == {"CUDA context + NCCL": CONTEXT_BYTES, "rollout weights": PARAMETERS_7B * 2,
                       "rollout received bucket": bucket_7b()}
    assert memory.phase_bytes("gen") == {call: sum(values.values()) for call, values in terms.items()}
    assert memory.phase_terms("gen", 3) == terms  # replicas: every rank the same
    assert rollout.ranks[0].kv_cache_bytes == kv and memory.peak("gen").call == "rollout.generate_sequences"


def test_a_vllm_rollout_pool_holds_the_awake_engine_in_every_call_and_no_hf_weights(qwen_7b):
    memory = plan(qwen_7b, *SEPARATE, "rollout.engine=vllm", "rollout.vllm.gpu_memory_utilization=0.6")
    terms = memory.phase_terms("gen")
    awake = int(0.6 * 80 * GIB)  # never asleep: the rollout pool trains nothing
    assert terms == {
        "rollout.generate_sequences": {"CUDA context + NCCL": CONTEXT_BYTES, "vLLM engine (awake)": awake},
        "rollout.receive_weights": {"CUDA context + NCCL": CONTEXT_BYTES, "vLLM engine (awake)": awake,
                                    "rollout received bucket": bucket_7b()},
    }
    rollout = next(role for role in memory.roles if role.role == "rollout")
    assert rollout.ranks[0].state_bytes == 0 and rollout.ranks[0].kv_cache_bytes == 0  # the HF copy is freed
    assert memory.process_bytes()["gen"] == CONTEXT_BYTES + awake + bucket_7b()


def test_without_the_device_memory_the_rollout_pools_vllm_share_is_unknown(qwen_7b, monkeypatch):
    from rlhfctl.recipe import memory_plan

    monkeypatch.setattr(memory_plan, "_cuda_memory", lambda: None)
    memory = plan(qwen_7b, *SEPARATE, "rollout.engine=vllm", device_memory=None)
    assert [phase.unknown for phase in memory.phases["gen"] if phase.rank == 0] == [["vLLM engine (awake)"]] * 2
    assert memory.misfits() == []


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_the_actors_pool_does_not_generate_and_sends_one_bucket_at_a_time(qwen_7b, engine):
    memory = plan(qwen_7b, *SEPARATE, f"rollout.engine={engine}")
    calls = memory.phase_terms("main")
    assert list(calls) == ["reference.compute_ref_log_prob", "actor.compute_log_prob", "actor.update_actor", "actor.send_weights"]
    kinds = {term.kind for phase in memory.phases["main"] for term in phase.terms}
    assert not kinds & {"engine", "residue", "kv_cache"}  # no vLLM share, no asleep residue, no KV cache
    actor = next(role for role in memory.roles if role.role == "actor")
    assert {rank.kv_cache_bytes for rank in actor.ranks} == {0}
    state = {name: calls["actor.update_actor"][name] for name in ("CUDA context + NCCL", "actor weights",
                                                                  "actor optimizer", "reference weights")}
    assert calls["actor.send_weights"] == {**state, "actor send bucket (gathered)": bucket_7b(),
                                           "actor send buffer (packed)": bucket_7b()}  # rank 0 packs and broadcasts
    rank1 = memory.phase_terms("main", 1)["actor.send_weights"]
    assert "actor send buffer (packed)" not in rank1 and rank1["actor send bucket (gathered)"] == bucket_7b()
    send = next(phase for phase in memory.phases["main"] if phase.call == "actor.send_weights")
    assert "never the whole model" in send.terms[-2].formula and "actor gathered weights" not in calls["actor.send_weights"]
    assert send.group == "weight sync"


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_the_colocated_recipe_keeps_generation_on_the_actors_pool_and_its_other_calls_are_the_same(qwen_7b, engine):
    colocated = plan(qwen_7b, f"rollout.engine={engine}")
    separate = plan(qwen_7b, *SEPARATE, f"rollout.engine={engine}")
    assert "gen" not in colocated.phases and "rollout" not in {role.role for role in colocated.roles}
    before = colocated.phase_terms("main")
    assert list(before) == ["actor.generate_sequences", "reference.compute_ref_log_prob", "actor.compute_log_prob",
                            "actor.update_actor"]  # no send_weights: the sync is a copy inside the process
    residue = "vLLM engine (asleep)"  # the colocated engine sleeps through the training calls
    shared = {call: {name: size for name, size in terms.items() if name != residue}
              for call, terms in before.items() if call != "actor.generate_sequences"}
    after = {call: terms for call, terms in separate.phase_terms("main").items() if call != "actor.send_weights"}
    assert after == shared
    assert (residue in before["actor.update_actor"]) == (engine == "vllm")


def test_stream_chunks_split_the_rollout_ranks_rows_over_calls():
    pools = {"global": PoolInfo("global", ("actor", "reward"), (1,), False, 4, None),
             "gen": PoolInfo("gen", ("rollout",), (2,), False, 4, None)}
    separate = {"placement": "separate", "pool": "gen", "engine": "hf"}
    whole = plan_memory(resolve_mapping(tiny_recipe(rollout=separate, trainer={"batch_size": 8})), pools)
    chunked = plan_memory(resolve_mapping(tiny_recipe(rollout={**separate, "stream_chunks": 2}, trainer={"batch_size": 8})), pools)
    rollout = next(role for role in whole.roles if role.role == "rollout")
    terms = whole.phase_terms("gen")["rollout.generate_sequences"]
    # 8 prompts x n 2 over 2 ranks = 8 rows x (32 prompt + 8 response) x 2 layers x KV width 32 x (k, v) x fp32
    assert terms["rollout KV cache"] == 8 * 40 * 2 * 32 * 2 * 4
    assert chunked.phase_terms("gen")["rollout.generate_sequences"]["rollout KV cache"] == 4 * 40 * 2 * 32 * 2 * 4
    # A bucket of the tiny model is the whole model (far under 256 MiB), in its float32 compute dtype.
    assert whole.phase_terms("gen")["rollout.receive_weights"]["rollout received bucket"] == rollout.parameters * 4
    assert "CUDA context + NCCL" not in terms  # a CPU pool


def test_a_vllm_rollout_on_a_cpu_pool_holds_its_weights_and_the_cpu_kv_cache():
    pools = {"global": PoolInfo("global", ("actor", "reward"), (1,), False, 4, None),
             "gen": PoolInfo("gen", ("rollout",), (1,), False, 4, None)}
    recipe = tiny_recipe(rollout={"placement": "separate", "pool": "gen", "engine": "vllm", "vllm": {"cpu_kv_cache_gib": 0.25}})
    memory = plan_memory(resolve_mapping(recipe), pools)
    rollout = next(role for role in memory.roles if role.role == "rollout")
    engine = rollout.parameters * 4 + GIB // 4
    assert memory.phase_terms("gen") == {"rollout.generate_sequences": {"vLLM engine": engine},
                                         "rollout.receive_weights": {"vLLM engine": engine,
                                                                     "rollout received bucket": rollout.parameters * 4}}


def test_a_misfit_on_the_rollout_pool_names_the_rollout_pools_knobs(qwen_7b):
    memory = plan(qwen_7b, *SEPARATE, "rollout.engine=hf", device_memory=16 * GIB)
    misfit = next(item for item in memory.misfits() if (item.pool, item.call) == ("gen", "rollout.generate_sequences"))
    terms = memory.phase_terms("gen")["rollout.generate_sequences"]
    per_row = terms["rollout KV cache"] + terms["rollout activations"] + terms["rollout logits"]
    assert misfit.knobs == (f"rollout.engine: vllm (acts on {(per_row + terms['rollout weights']) / GIB:.1f} GiB)",
                            f"more ranks (resource_pools.gen.process_on_nodes, now 4) (acts on {per_row / GIB:.1f} GiB)")
    assert misfit.message.startswith(f"memory plan: pool gen needs {sum(terms.values()) / GIB:.1f} GiB in rollout.generate_sequences")
    assert not any("roles.rollout" in knob for item in memory.misfits() for knob in item.knobs)  # no such keys
    greedy = plan(qwen_7b, *SEPARATE, "rollout.engine=vllm", "rollout.vllm.gpu_memory_utilization=0.99")
    receive = next(item for item in greedy.misfits() if item.call == "rollout.receive_weights")
    over = receive.needed - 80 * GIB
    share = (int(0.99 * 80 * GIB) - over) / (80 * GIB)
    assert receive.pool == "gen" and receive.knobs == (
        f"rollout.vllm.gpu_memory_utilization {share:.2f} (now 0.99) (acts on {int(0.99 * 80 * GIB) / GIB:.1f} GiB)",
        f"a smaller rollout.vllm.sync_bucket_mib (acts on {bucket_7b() / GIB:.1f} GiB)")


def test_validate_refuses_naming_the_rollout_pool(qwen_7b):
    report = validate_recipe(load_recipe(RECIPE, overrides(qwen_7b, *SEPARATE, "rollout.engine=hf")), device_memory=16 * GIB)
    refused = {issue.message for issue in report.errors if issue.key_path == "resource_pools.gen"}
    assert any(message.startswith("memory plan: pool gen needs ") and " in rollout.generate_sequences" in message
               and "rollout.engine: vllm" in message for message in refused)
    result = CliRunner().invoke(app, ["validate", str(RECIPE), *overrides(qwen_7b, *SEPARATE, "rollout.engine=hf"),
                                      "--device-memory", "16"])
    assert result.exit_code == 2, result.output  # above the device: exit 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: memory plan: pool gen")]
    assert lines and "more ranks (resource_pools.gen.process_on_nodes, now 4)" in " ".join(lines)
    assert "Memory plan: pool gen, rank 0" in result.stdout and "peak rollout (rollout.generate_sequences)" in result.stdout
