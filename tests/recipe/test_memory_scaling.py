"""The memory plan past one GPU (issue 35): 70B on 4 x 8 GPUs and 32B on 8, through the real CLI on local config.json
files (no downloads); vLLM tensor parallel, offload between phases, per-unit scoring, a LoRA base in compute dtype, MoE
experts; a misfit is exit 2 from validate and from train."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlhfctl.cli.app import app
from rlhfctl.recipe import memory_plan
from rlhfctl.recipe.memory_plan import CONTEXT_BYTES, LOGIT_FP32_COPIES, VLLM_ASLEEP_BYTES

GIB = 2**30

#: Llama-3.1-70B's config.json (the values that size the model).
LLAMA31_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-05, "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128001,
}
#: Qwen2.5-32B's config.json.
QWEN25_32B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 27648,
    "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8, "vocab_size": 152064,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-06, "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151643,
}
#: Qwen3-30B-A3B's config.json: 128 experts of width 768, 8 active per token.
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-06, "hidden_act": "silu", "decoder_sparse_step": 1, "mlp_only_layers": [],
    "bos_token_id": 151643, "eos_token_id": 151645,
}

# Llama-3.1-70B by hand: the root unit is the embeddings and the untied head (128256 x 8192 each) and the final norm;
# a decoder layer is q and o (8192 x 8192), k and v (8192 x 1024), gate, up and down (8192 x 28672) and two norms.
ROOT_70B = 2 * 128256 * 8192 + 8192
LAYER_70B = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
PARAMETERS_70B = ROOT_70B + 80 * LAYER_70B
LORA_32B = {"r": 64, "alpha": 128, "target_modules": "all-linear"}


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """Local model directories holding each config.json, and a one-line data file."""
    root = tmp_path_factory.mktemp("scaling")
    for name, config in (("llama70b", LLAMA31_70B), ("qwen32b", QWEN25_32B), ("qwen3moe", QWEN3_30B_A3B)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    (root / "train.jsonl").write_text('{"prompt": "1 + 1 =", "ground_truth": "2"}\n')
    return root


def validate(configs, model: str, *args: str, recipe: str = "70b-32gpu"):
    overrides = [f"roles.actor.model.path={configs / model}", f"data.train_files=[{configs / 'train.jsonl'}]"]
    result = CliRunner().invoke(app, ["validate", recipe, *overrides, *args])
    assert "Traceback" not in result.output, result.output
    return result


def rank0_terms(memory, pool: str = "main") -> dict[str, dict[str, int]]:
    return {phase["call"]: {term["name"]: term["bytes"] for term in phase["terms"]}
            for phase in memory["phases"][pool] if phase["rank"] == 0}


def test_70b_on_32_gpus_at_tp_8_with_offload_peaks_under_90_percent_every_term_by_hand(configs, monkeypatch):
    def no_cuda():
        raise AssertionError("--device-memory given: CUDA's memory is not consulted")

    monkeypatch.setattr(memory_plan, "_cuda_memory", no_cuda)  # a CPU machine planning for an 80 GiB GPU
    result = validate(configs, "llama70b", "--device-memory", "80", "--format", "json")
    assert result.exit_code == 0, result.output
    memory = json.loads(result.stdout)["memory"]
    assert memory["device_source"] == "--device-memory" and memory["misfits"] == [] and memory["tight"] == []
    assert {role["role"]: role["parameters"] for role in memory["roles"]} == {"actor": PARAMETERS_70B, "reference": PARAMETERS_70B}
    terms = rank0_terms(memory)
    rollout, ref_pass = terms["actor.generate_sequences"], terms["reference.compute_ref_log_prob"]
    old_pass, update = terms["actor.compute_log_prob"], terms["actor.update_actor"]
    fp32_shard, bf16_shard = PARAMETERS_70B * 4 // 32, PARAMETERS_70B * 2 // 32  # every dim-0 splits 32 ways evenly
    logits = 1024 * 128256 * (2 + 4 * LOGIT_FP32_COPIES)  # one chunk of 1024 response tokens
    # rollout: the actor's own call (its weights are back), AdamW and the reference wait on the host; vLLM's 0.6 share
    assert rollout == {"CUDA context + NCCL": CONTEXT_BYTES, "actor weights": fp32_shard, "actor optimizer": 0,
                       "reference weights": 0, "vLLM engine (awake)": int(0.6 * 80 * GIB)}
    # reference pass: 64 x 8 / 32 = 16 rows of 512 + 1024 tokens; one FSDP2 unit at a time (root + two layers)
    assert ref_pass == {"CUDA context + NCCL": CONTEXT_BYTES, "actor weights": 0, "actor optimizer": 0,
                        "reference weights": bf16_shard, "vLLM engine (asleep)": VLLM_ASLEEP_BYTES,
                        "reference gathered units": (ROOT_70B + 2 * LAYER_70B) * 2,
                        "reference activations": 16 * 1536 * (4 * 8192 + 3 * 28672) * 2, "reference logits": logits}
    assert old_pass["actor gathered units"] == (ROOT_70B + 2 * LAYER_70B) * 2
    assert old_pass["actor activations"] == 2 * 1536 * (4 * 8192 + 3 * 28672) * 2  # micro_batch_size 2
    # update: master weights, AdamW and gradients on the device; FSDP2's units; 2 x 1536 tokens, checkpointed
    assert update == {"CUDA context + NCCL": CONTEXT_BYTES, "actor weights": fp32_shard, "actor optimizer": 2 * fp32_shard,
                      "reference weights": 0, "vLLM engine (asleep)": VLLM_ASLEEP_BYTES, "actor gradients": fp32_shard,
                      "actor gathered units": (2 * ROOT_70B + 2 * LAYER_70B) * 2 + ROOT_70B * 4,
                      "actor activations": 3072 * (6 * 8192 + 2 * 1024 + 4 * 28672) * 2 + 3072 * 8192 * 2 * 80,
                      "actor logits": logits}
    peak = memory["peak"]["main"]
    assert peak["call"] == "actor.update_actor" and peak["bytes"] == sum(update.values())
    assert peak["bytes"] <= 0.9 * 80 * GIB and round(peak["bytes"] / GIB, 2) == 60.60
    engine = memory["engines"]["main"]  # TP 8: 1/8 of the bf16 weights and one sequence's KV (1 KV head a rank)
    assert engine["tensor_parallel_size"] == 8 and engine["weights"] == PARAMETERS_70B * 2 // 8
    assert engine["kv_cache"] == 2 * 80 * 1 * 128 * 1536 * 2 and engine["fits"] and engine["budget"] == int(0.6 * 80 * GIB)


def test_70b_at_tp_1_is_exit_2_naming_the_tensor_parallel_size_that_fits(configs):
    result = validate(configs, "llama70b", "rollout.vllm.tensor_parallel_size=1", "--device-memory", "80")
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: memory plan")]
    weights = PARAMETERS_70B * 2
    assert line.startswith(f"error: memory plan: pool main's vLLM engine (actor.generate_sequences) needs "
                           f"{(weights + 2 * 80 * 8 * 128 * 1536 * 2) / GIB:.1f} GiB per rank, more than its share: "
                           "rollout.vllm.gpu_memory_utilization 0.6 x 80.0 GiB (48.0 GiB); largest terms: weights "
                           f"{weights / GIB:.1f} GiB (1/1 of the model)")
    # t = 2 leaves 65.7 GiB of weights a rank; t = 4 is the smallest whose 32.9 GiB fit the 48 GiB share
    assert "try rollout.vllm.tensor_parallel_size 4 (now 1;" in line
    assert "gpu_memory_utilization" not in line.split("; try ")[1]  # no share under the whole device holds 131 GiB
    assert "does not fit its share" in result.stdout and "recipe has 1 error" in result.stderr


@pytest.mark.parametrize(("t", "code"), [(1, 2), (2, 0)])
def test_32b_lora_on_8_gpus_needs_tp_2(configs, t, code):
    result = validate(configs, "qwen32b", "resource_pools.main.process_on_nodes=[8]", "roles.reference=null",
                      f"roles.actor.lora={json.dumps(LORA_32B)}", f"rollout.vllm.tensor_parallel_size={t}",
                      "--device-memory", "80", "--format", "json")
    assert result.exit_code == code, result.output
    memory = json.loads(result.stdout)["memory"]
    actor = memory["roles"][0]
    base = actor["parameters"] - actor["trainable_parameters"]
    assert base == 32_763_876_352  # Qwen2.5-32B; the adapter is r 64 on every linear layer
    # the frozen base in bf16, only the adapter as float32 masters with AdamW moments (8-way shards)
    assert actor["ranks"][0]["param_bytes"] == pytest.approx((base * 2 + actor["trainable_parameters"] * 4) / 8, rel=1e-4)
    assert actor["ranks"][0]["optimizer_bytes"] == pytest.approx(actor["trainable_parameters"] * 8 / 8, rel=1e-4)
    engine = memory["engines"]["main"]
    assert engine["weights"] == -(-base // t) * 2  # the engine serves the base with the adapter merged
    assert engine["fits"] is (t == 2)
    if t == 1:
        (misfit,) = memory["misfits"]
        assert misfit["key_path"] == "rollout.vllm.tensor_parallel_size"
        assert misfit["knobs"][0].startswith("rollout.vllm.tensor_parallel_size 2 (now 1;")
    else:
        assert memory["peak"]["main"]["bytes"] <= 0.9 * 80 * GIB


def test_32b_full_fine_tune_on_8_gpus_is_refused_in_the_update_naming_the_knobs(configs):
    result = validate(configs, "qwen32b", "resource_pools.main.process_on_nodes=[8]", "rollout.vllm.tensor_parallel_size=2",
                      "--device-memory", "80")
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: memory plan")]
    assert " in actor.update_actor, 102% of the device's 80.0 GiB" in line
    assert "largest terms: actor optimizer 30.5 GiB, actor weights 15.3 GiB, actor gradients 15.3 GiB" in line
    assert "more ranks (resource_pools.main.process_on_nodes, now 8)" in line and "roles.actor.fsdp.cpu_offload: true" in line
    fits = validate(configs, "qwen32b", "resource_pools.main.process_on_nodes=[8,8]", "rollout.vllm.tensor_parallel_size=2",
                    "--device-memory", "80")
    assert fits.exit_code == 0, fits.output  # 16 GPUs halve every shard


def test_a_moe_model_counts_every_expert_and_its_activations_by_the_active_ones(configs):
    result = validate(configs, "qwen3moe", "resource_pools.main.process_on_nodes=[8]", "rollout.vllm.tensor_parallel_size=2",
                      "--device-memory", "80", "--format", "json")
    memory = json.loads(result.stdout)["memory"]
    assert memory["skipped"] == {}
    parameters = {role["role"]: role["parameters"] for role in memory["roles"]}
    # 48 layers x (attention 2048 x (4096 + 512 + 512) + 4096 x 2048 + q/k norms 2 x 128 + 128 experts x 3 x 2048 x 768
    # + router 128 x 2048 + 2 norms x 2048) + embeddings and head 2 x 151936 x 2048 + final norm 2048
    layer = 2048 * (4096 + 512 + 512) + 4096 * 2048 + 2 * 128 + 128 * 3 * 2048 * 768 + 128 * 2048 + 2 * 2048
    assert parameters["actor"] == parameters["reference"] == 48 * layer + 2 * 151936 * 2048 + 2048 == 30_532_122_624
    old_pass = rank0_terms(memory)["actor.compute_log_prob"]
    # 8 active experts of width 768 per token: 2 rows x 1536 tokens x (4 x 2048 + 3 x 8 x 768) x 2 B
    assert old_pass["actor activations"] == 2 * 1536 * (4 * 2048 + 3 * 8 * 768) * 2
    engine = memory["engines"]["main"]  # every expert is in the engine too: 56.9 GiB of bf16 weights, half a rank
    assert engine["weights"] == 30_532_122_624 and engine["fits"]


def test_train_refuses_a_misfit_before_launch_with_exit_2(configs, tmp_path, monkeypatch):
    monkeypatch.setattr(memory_plan, "_cuda_memory", lambda: 80 * GIB)  # as on a driver with an 80 GiB GPU
    output = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "70b-32gpu", f"roles.actor.model.path={configs / 'llama70b'}",
                                      f"data.train_files=[{configs / 'train.jsonl'}]", f"trainer.output_dir={output}",
                                      "rollout.vllm.tensor_parallel_size=1"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "error: memory plan: pool main's vLLM engine (actor.generate_sequences)" in result.stderr
    assert "try rollout.vllm.tensor_parallel_size 4 (now 1;" in result.stderr
    assert not output.exists()  # refused before the output directory, Ray or any worker


def _tiny_plan(actor: dict, rollout: dict | None = None, use_gpu: bool = True):
    from rlhfctl.recipe.memory_plan import plan_memory
    from rlhfctl.recipe.pools import PoolInfo
    from rlhfctl.recipe.resolved import resolve_mapping
    from tests.workers.recipes import tiny_recipe

    recipe = tiny_recipe(roles={"actor": actor}, rollout=rollout or {}, trainer={"ppo_epochs": 2})
    return plan_memory(resolve_mapping(recipe), {"main": PoolInfo("main", ("actor",), (1,), use_gpu, 4, None)}, 80 * GIB)


def test_a_mixtral_counts_every_expert_and_its_activations_by_the_two_active():
    def mixtral(experts: int, active: int) -> dict:
        return {"model": {"config": {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 96,
                                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
                                     "num_local_experts": experts, "num_experts_per_tok": active,
                                     "max_position_embeddings": 128}}}

    four, two, one = _tiny_plan(mixtral(4, 2)), _tiny_plan(mixtral(2, 2)), _tiny_plan(mixtral(4, 1))
    # two more experts in each of 2 layers: gate, up and down (3 x 64 x 96) and their router rows (64 each)
    assert four.roles[0].parameters - two.roles[0].parameters == 2 * 2 * (3 * 64 * 96 + 64)
    top2, top1 = (plan.phase_terms("main")["actor.compute_log_prob"]["actor activations"] for plan in (four, one))
    # per token: 4 x hidden + 3 x (active experts x expert width): 4 x 64 + 3 x 2 x 96 against 4 x 64 + 3 x 96
    assert top2 * (4 * 64 + 3 * 96) == top1 * (4 * 64 + 3 * 2 * 96)


def test_a_cpu_engine_at_tensor_parallel_2_holds_half_the_weights():
    whole = _tiny_plan({}, {"engine": "vllm"}, use_gpu=False)
    half = _tiny_plan({}, {"engine": "vllm", "vllm": {"tensor_parallel_size": 2}}, use_gpu=False)
    parameters = whole.roles[0].parameters
    engine = [plan.phase_terms("main")["actor.generate_sequences"]["vLLM engine"] for plan in (whole, half)]
    assert engine[0] - engine[1] == (parameters - -(-parameters // 2)) * 4  # float32 tiny model
    assert whole.engines == {} == half.engines  # no share of a device to check on CPU


def test_the_token_budget_a_misfit_names_makes_the_update_fit(configs):
    over = validate(configs, "llama70b", "roles.actor.micro_batch_tokens=24000", "--device-memory", "80")
    assert over.exit_code == 2, over.output
    (line,) = [line for line in over.stderr.splitlines() if line.startswith("error: memory plan")]
    assert " in actor.update_actor, 116% of the device's 80.0 GiB (12.6 GiB over); largest terms: actor activations" in line
    assert "try roles.actor.micro_batch_tokens 15755 (now 24000) (acts on 36.7 GiB)" in line
    named = validate(configs, "llama70b", "roles.actor.micro_batch_tokens=15755", "--device-memory", "80", "--format", "json")
    assert named.exit_code == 0, named.output
    peak = json.loads(named.stdout)["memory"]["peak"]["main"]
    assert 0.9 * 80 * GIB < peak["bytes"] <= 80 * GIB  # fits, just: a counted warning above 90%
    short = validate(configs, "llama70b", "roles.actor.micro_batch_tokens=1600", "--device-memory", "57")
    (line,) = [line for line in short.stderr.splitlines() if line.startswith("error: memory plan")]
    assert "roles.actor.micro_batch_tokens 1536 (now 1600, not enough alone)" in line  # never below one sequence
