"""rollout.dtype with the hf engine: colocated, the actor samples from a copy of its model in that dtype and returns
the decoding loop's behaviour log-probs; in the actor's own dtype it is today's path, token for token; the rollout
group of rollout.placement: separate builds its model in it."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.workers.conftest import local_group
from tests.workers.recipes import digits_prompts, tiny_recipe
from tests.workers.test_actor import with_advantages
from workers import ActorWorker
from workers.rollout_worker import RolloutWorker



def _separate(dtype: str | None = None) -> dict:
    """The tiny recipe with a rollout group of its own on pool gen, its engine in ``dtype`` (None: unset)."""
    rollout = {"placement": "separate", "pool": "gen", **({} if dtype is None else {"dtype": dtype})}
    return tiny_recipe(rollout=rollout, resource_pools={"gen": {"process_on_nodes": [1], "use_gpu": False}})


def _response_gap(engine: torch.Tensor, actor: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |engine - actor| log-prob over the response tokens: the metric rollout/logprob_diff logs."""
    mask = mask.bool()
    return float((engine - actor).abs()[mask].mean())


def test_a_bf16_rollout_of_a_float32_actor_returns_log_probs_a_little_apart_from_the_actors():
    with local_group(ActorWorker, tiny_recipe(rollout={"dtype": "bfloat16"}), "actor") as group:
        replica = group.workers[0].generator.replica
        assert replica is not None and {p.dtype for p in replica.model.parameters()} == {torch.bfloat16}
        rollout = group.generate_sequences(digits_prompts(4))
        assert rollout.batch["rollout_log_probs"].shape == rollout.batch["responses"].shape == (8, 8)
        old = group.compute_log_prob(rollout).batch["old_log_probs"]
        gap = _response_gap(rollout.batch["rollout_log_probs"], old, rollout.batch["response_mask"])
        # bf16 keeps 8 bits of mantissa: its log-probs differ from float32's, by far less than one nat.
        print(f"bf16 vs float32 log-prob gap {gap:.4g}")
        assert 1e-4 < gap < 0.02, gap
        padding = ~rollout.batch["response_mask"].bool()
        assert torch.all(rollout.batch["rollout_log_probs"][padding] == 0)


def test_the_bf16_replica_takes_the_actors_weights_after_each_update():
    with local_group(ActorWorker, tiny_recipe(rollout={"dtype": "bf16"}), "actor") as group:
        worker = group.workers[0]
        rollout = group.generate_sequences(digits_prompts(4))
        metrics = group.update_actor(with_advantages(rollout))[0]
        assert metrics["rollout/logprob_diff"] > 0  # the engine's log-probs reached the update
        assert not worker.generator.replica.current  # stale until the next rollout
        group.generate_sequences(digits_prompts(4, seed=1))
        trained = dict(worker.model.named_parameters())
        for name, weight in worker.generator.replica.model.named_parameters():
            assert torch.equal(weight, trained[name].detach().to(torch.bfloat16)), name


def test_a_lora_actors_bf16_replica_holds_the_merged_weights():
    recipe = tiny_recipe(rollout={"dtype": "bf16"}, roles={"actor": {"lora": {"r": 4, "alpha": 8}, "optim": {"lr": 5e-2}}})
    with local_group(ActorWorker, recipe, "actor") as group:
        worker = group.workers[0]
        for seed in range(2):  # two updates: lora_B leaves zero first, then the adapter's delta is nonzero
            group.update_actor(with_advantages(group.generate_sequences(digits_prompts(4, seed=seed))))
        rollout = group.generate_sequences(digits_prompts(4, seed=2))
        merged = dict(copy.deepcopy(worker.model).merge_and_unload().named_parameters())  # peft's own merge, float32
        replica = dict(worker.generator.replica.model.named_parameters())
        assert set(replica) == set(merged)
        for name, weight in replica.items():
            assert torch.equal(weight, merged[name].detach().to(torch.bfloat16)), name
        old = group.compute_log_prob(rollout).batch["old_log_probs"]
        gap = _response_gap(rollout.batch["rollout_log_probs"], old, rollout.batch["response_mask"])
        assert 0 < gap < 0.02, gap


@pytest.mark.parametrize("same", ["float32", "fp32"])
def test_rollout_dtype_equal_to_the_actors_samples_exactly_as_today(same):
    with local_group(ActorWorker, tiny_recipe(), "actor") as today:
        expected = today.generate_sequences(digits_prompts(4))
        expected_lp = today.compute_log_prob(expected).batch["old_log_probs"]
    with local_group(ActorWorker, tiny_recipe(rollout={"dtype": same}), "actor") as group:
        assert group.workers[0].generator.replica is None
        got = group.generate_sequences(digits_prompts(4))
        assert "rollout_log_probs" not in got.batch  # the actor samples what it scores: nothing to return
        assert torch.equal(got.batch["responses"], expected.batch["responses"])
        assert torch.equal(group.compute_log_prob(got).batch["old_log_probs"], expected_lp)


def test_the_rollout_group_builds_its_model_in_rollout_dtype_and_matches_today_in_the_actors():
    with local_group(RolloutWorker, _separate(), "rollout") as today:
        expected = today.generate_sequences(digits_prompts(4))
    with local_group(RolloutWorker, _separate("float32"), "rollout") as same:
        got = same.generate_sequences(digits_prompts(4))
    assert torch.equal(got.batch["responses"], expected.batch["responses"])
    assert torch.equal(got.batch["rollout_log_probs"], expected.batch["rollout_log_probs"])
    with local_group(RolloutWorker, _separate("bfloat16"), "rollout") as bf16:
        assert {p.dtype for p in bf16.workers[0].model.parameters()} == {torch.bfloat16}
        sampled = bf16.generate_sequences(digits_prompts(4))
    gap = _response_gap(sampled.batch["rollout_log_probs"], expected.batch["rollout_log_probs"],
                        sampled.batch["response_mask"] * expected.batch["response_mask"])
    assert sampled.batch["rollout_log_probs"].dtype == torch.float32 and gap > 0
