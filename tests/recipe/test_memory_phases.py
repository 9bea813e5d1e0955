"""The memory plan per call: a Qwen2.5-7B GRPO recipe on 8 GPUs through the real CLI, --device-memory units,
and the knobs a call that does not fit names."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlhfctl.cli.app import app
from rlhfctl.recipe.memory_plan import CONTEXT_BYTES, LOGIT_FP32_COPIES, VLLM_ASLEEP_BYTES, parse_memory_size, plan_memory
from rlhfctl.recipe.pools import PoolInfo
from rlhfctl.recipe.resolved import resolve_mapping
from tests.recipe.builders import PARAMETERS_7B
from tests.workers.recipes import tiny_recipe
from rlhfctl.engine.log_probs import LOGITS_CHUNK_TOKENS

GIB = 2**30
#: colocated-8gpu as the issue's reference run: GRPO, actor + reference, no critic, vLLM at its default share.
GRPO_7B = ["algorithm.adv_estimator=grpo", "roles.critic=null"]


def validate(qwen_7b, *args: str):
    overrides = [f"roles.actor.model.path={qwen_7b / 'model'}", f"data.train_files=[{qwen_7b / 'train.jsonl'}]", *GRPO_7B]
    return CliRunner().invoke(app, ["validate", "colocated-8gpu", *overrides, *args])


def test_the_7b_grpo_recipe_peaks_in_the_rollout_at_50_to_70_gb_with_every_term_counted(qwen_7b):
    result = validate(qwen_7b, "--device-memory", "80", "--format", "json")
    assert result.exit_code == 0, result.output
    memory = json.loads(result.stdout)["memory"]
    assert memory["device_memory"] == 80 * GIB  # a bare number is GiB
    peak = memory["peak"]["main"]
    assert peak["call"] == "actor.generate_sequences" and 50e9 <= peak["bytes"] <= 70e9
    calls = {phase["call"]: phase for phase in memory["phases"]["main"] if phase["rank"] == 0}
    assert list(calls) == ["actor.generate_sequences", "reference.compute_ref_log_prob", "actor.compute_log_prob",
                           "actor.update_actor"]
    terms = {call: {term["name"]: term["bytes"] for term in phase["terms"]} for call, phase in calls.items()}
    rollout, ref_pass, update = terms["actor.generate_sequences"], terms["reference.compute_ref_log_prob"], terms["actor.update_actor"]
    # State: rank 0 holds the most of each uneven dim-0 split, so a hair over params x bytes / 8.
    assert rollout["actor weights"] == pytest.approx(PARAMETERS_7B * 4 / 8, rel=1e-3)
    assert rollout["actor optimizer"] == pytest.approx(PARAMETERS_7B * 8 / 8, rel=1e-3)
    assert rollout["reference weights"] == pytest.approx(PARAMETERS_7B * 2 / 8, rel=1e-3)
    assert "actor gradients" not in rollout  # freed after every optimizer step
    assert update["actor gradients"] == pytest.approx(PARAMETERS_7B * 4 / 8, rel=1e-3)
    assert rollout["vLLM engine (awake)"] == 40 * GIB and rollout["CUDA context + NCCL"] == CONTEXT_BYTES
    assert ref_pass["vLLM engine (asleep)"] == VLLM_ASLEEP_BYTES and "vLLM engine (awake)" not in ref_pass
    # FSDP2 unshards one unit at a time: the root (embeddings 152064 x 3584, head the same, final norm 3584) and two
    # decoder layers (233,057,792 parameters each: 28 of them + the root = PARAMETERS_7B), in bf16.
    root, layer = 2 * 152064 * 3584 + 3584, 233_057_792
    assert 28 * layer + root == PARAMETERS_7B
    assert ref_pass["reference gathered units"] == (root + 2 * layer) * 2
    assert "reference gathered weights" not in ref_pass  # no longer the whole model
    # 32 rows a rank (128 x 2 / 8) x 257 response positions, scored one chunk at a time: bf16 + fp32 copies
    per_token = 152064 * (2 + 4 * LOGIT_FP32_COPIES)
    assert ref_pass["reference logits"] == min(LOGITS_CHUNK_TOKENS, 32 * 257) * per_token
    assert {"actor gathered units", "actor activations", "actor logits"} <= set(update)
    assert peak["bytes"] == sum(rollout.values())
    table = validate(qwen_7b, "--device-memory", "80")
    assert table.exit_code == 0, table.output
    assert "peak rollout (actor.generate_sequences)" in table.stdout and "of 80.00 GiB" in table.stdout
    assert "vLLM engine (awake)" in table.stdout and "reference logits" in table.stdout


def test_the_hf_engine_gathers_the_whole_model_in_compute_dtype_for_the_rollout(qwen_7b):
    result = validate(qwen_7b, "rollout.engine=hf", "--device-memory", "80GiB", "--format", "json")
    assert result.exit_code == 0, result.output
    rollout = next(phase for phase in json.loads(result.stdout)["memory"]["phases"]["main"]
                   if phase["call"] == "actor.generate_sequences" and phase["rank"] == 0)
    terms = {term["name"]: term["bytes"] for term in rollout["terms"]}
    assert terms["actor gathered weights"] == PARAMETERS_7B * 2
    # 32 rows x (256 + 256) tokens x 28 layers x 4 KV heads x 128 x (k, v) x 2 bytes
    assert terms["actor KV cache"] == 32 * 512 * 28 * 4 * 128 * 2 * 2
    assert not any(name.startswith("vLLM") for name in terms)


def test_a_call_over_the_device_exits_2_and_one_over_90_percent_is_a_warning_naming_the_knobs(qwen_7b):
    tight = validate(qwen_7b, "--device-memory", "32")
    assert tight.exit_code == 0, tight.output  # 91.9% and 94.7%: counted warnings
    lines = [line for line in tight.stdout.splitlines() if line.startswith("warning: memory plan")]
    assert len(lines) == 2 and "recipe is valid (5 warnings)" in tight.stdout
    assert lines[1].startswith("warning: memory plan: pool main needs 30.3 GiB in actor.update_actor, 95% of the "
                               "device's 32.0 GiB (above 90%: little room for the allocator); largest terms: actor "
                               "gathered units 9.0 GiB, actor optimizer 7.1 GiB, actor weights 3.5 GiB; try ")
    assert "more ranks (resource_pools.main.process_on_nodes, now 8)" in lines[1]
    assert "roles.actor.micro_batch_size 1 (now 4, not enough alone)" in lines[1]
    assert "rollout.vllm.gpu_memory_utilization 0.48 (now 0.50)" in lines[0]  # the engine's 14.2 GiB still fits 15.4
    assert "roles.actor.fsdp.optimizer_offload: true (acts on 7.1 GiB)" in lines[0]  # AdamW waits on the host
    over = validate(qwen_7b, "--device-memory", "28")
    assert over.exit_code == 2, over.output
    assert ("error: memory plan: pool main needs 30.3 GiB in actor.update_actor, 108% of the device's 28.0 GiB "
            "(2.3 GiB over)") in over.stderr
    greedy = validate(qwen_7b, "rollout.vllm.gpu_memory_utilization=0.9", "--device-memory", "80", "--format", "json")
    assert greedy.exit_code == 2
    (misfit,) = json.loads(greedy.stdout)["memory"]["misfits"]
    assert misfit["call"] == "actor.generate_sequences" and misfit["key_path"] == "resource_pools.main"
    assert misfit["knobs"][0].startswith("rollout.vllm.gpu_memory_utilization 0.83 (now 0.90)")


def test_a_token_budget_sizes_the_update_micro_batch():
    pools = {"main": PoolInfo("main", ("actor",), (1,), True, 4, None)}
    by_rows = plan_memory(resolve_mapping(tiny_recipe(roles={"actor": {"micro_batch_size": 8}}, trainer={"ppo_epochs": 2})), pools, 80 * GIB)
    by_tokens = plan_memory(resolve_mapping(tiny_recipe(roles={"actor": {"micro_batch_tokens": 40}}, trainer={"ppo_epochs": 2})), pools, 80 * GIB)
    rows = by_rows.phase_terms("main")["actor.update_actor"]
    tokens = by_tokens.phase_terms("main")["actor.update_actor"]
    # 8 rows x (32 prompt + 8 response) tokens against a 40-token budget: 8x the activations
    assert rows["actor activations"] == 8 * tokens["actor activations"]
    assert by_rows.phase_bytes("main") == {call: sum(v or 0 for v in terms.values())
                                           for call, terms in by_rows.phase_terms("main").items()}
    allocated = by_rows.phase_bytes("main", 0, allocated_only=True)  # beside torch.cuda.max_memory_allocated
    assert {call: allocated[call] + CONTEXT_BYTES for call in allocated} == by_rows.phase_bytes("main")
    assert list(allocated) == ["actor.generate_sequences", "actor.compute_log_prob", "actor.update_actor"]


def test_the_logits_follow_the_log_prob_pass_chunk(monkeypatch):
    import rlhfctl.engine.log_probs

    pools = {"main": PoolInfo("main", ("actor",), (1,), False, 4, None)}
    recipe = tiny_recipe(trainer={"batch_size": 64}, rollout={"max_new_tokens": 31}, roles={"actor": {"micro_batch_size": 64}})
    monkeypatch.setattr(rlhfctl.engine.log_probs, "LOGITS_CHUNK_TOKENS", 1000)
    chunked = plan_memory(resolve_mapping(recipe), pools).phase_terms("main")["actor.compute_log_prob"]["actor logits"]
    monkeypatch.setattr(rlhfctl.engine.log_probs, "LOGITS_CHUNK_TOKENS", 0)  # 0: the unchunked pass
    whole = plan_memory(resolve_mapping(recipe), pools).phase_terms("main")["actor.compute_log_prob"]["actor logits"]
    # a micro-batch of 64 rows (micro_batch_size) x 32 response positions = 2048 tokens, against chunks of 1000
    assert whole == chunked * 2048 / 1000


def test_the_vllm_share_of_an_unknown_device_is_unknown_not_zero(monkeypatch):
    from rlhfctl.recipe import memory_plan

    monkeypatch.setattr(memory_plan, "_cuda_memory", lambda: None)  # no --device-memory and no CUDA visible
    plan = plan_memory(resolve_mapping(tiny_recipe(rollout={"engine": "vllm"}, trainer={"ppo_epochs": 2})), {"main": PoolInfo("main", ("actor",), (1,), True, 4, None)})
    assert plan.phase_terms("main")["actor.generate_sequences"]["vLLM engine (awake)"] is None
    assert [phase.unknown for phase in plan.phases["main"]] == [["vLLM engine (awake)"], [], []]
    assert plan.misfits() == []


def test_device_memory_a_bare_number_is_gib_and_a_bad_size_exits_2_in_one_line(tmp_path):
    from tests.recipe.builders import recipe_data, write_recipe

    assert parse_memory_size("80") == 80 * GIB == parse_memory_size("80 GiB")
    assert parse_memory_size("40GB") == 40 * 10**9 and parse_memory_size("81920MiB") == 80 * GIB
    path = write_recipe(tmp_path, recipe_data())
    ok = CliRunner().invoke(app, ["validate", str(path), "--device-memory", "80", "--format", "json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["memory"]["device_memory"] == 80 * GIB
    for bad in ("80 bytes", "80B", "0", "-8", "lots", "nan"):
        result = CliRunner().invoke(app, ["validate", str(path), "--device-memory", bad])
        assert result.exit_code == 2, (bad, result.output)
        assert result.stderr.startswith("error: --device-memory: ") and len(result.stderr.strip().splitlines()) == 1
        assert "Traceback" not in result.output


def test_the_help_says_a_bare_number_is_gib():
    result = CliRunner().invoke(app, ["validate", "--help"], env={"COLUMNS": "200"})
    assert "a bare number is GiB" in " ".join(result.stdout.split())
