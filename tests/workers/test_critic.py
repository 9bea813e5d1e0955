"""CriticWorker: values at response positions, value-loss updates, checkpoints."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.models.loading import load_token_value_model, token_values
from rlhfctl.protocol import DataProto
from tests.workers.conftest import local_group
from tests.workers.recipes import TINY_MODEL, digits_prompts, tiny_recipe, tokenizer
from workers import CriticWorker

CRITIC_METRICS = {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr", "memory/critic/state_gib"}


@pytest.fixture(scope="module")
def rollout(actor_group) -> DataProto:
    return actor_group.generate_sequences(digits_prompts(3))


def test_values_are_read_one_position_before_each_response_token(rollout):
    with local_group(CriticWorker, tiny_recipe(), "critic") as critic:  # falls back to the actor's model
        values = critic.compute_values(rollout).batch["values"]
    model = load_token_value_model(TINY_MODEL, tokenizer(), seed=0).eval()
    batch = rollout.batch
    with torch.no_grad():
        every = token_values(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    prompt_width = batch["prompts"].shape[1]
    expected = every[:, prompt_width - 1 : -1] * batch["response_mask"]
    assert values.shape == batch["responses"].shape
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=1e-5)


def test_updates_lower_the_value_loss_on_a_fixed_batch(rollout):
    recipe = tiny_recipe(roles={"critic": {"optim": {"lr": 1e-2}, "micro_batch_size": 4, "cliprange_value": None}})
    returns = torch.linspace(-1.0, 1.0, len(rollout))[:, None].expand_as(rollout.batch["response_mask"]).contiguous()
    losses = []
    with local_group(CriticWorker, recipe, "critic") as critic:
        for _ in range(6):
            values = critic.compute_values(rollout)
            batch = rollout.union(values).union(DataProto.from_dict({"returns": returns}))
            (metrics,) = critic.update_critic(batch)
            assert set(metrics) == CRITIC_METRICS
            losses.append(metrics["critic/vf_loss"])
    assert losses[-1] < 0.5 * losses[0], losses


def test_critic_checkpoint_round_trip(rollout, tmp_path):
    returns = torch.ones_like(rollout.batch["response_mask"], dtype=torch.float32)
    with local_group(CriticWorker, tiny_recipe(), "critic") as critic:
        def step() -> None:
            batch = rollout.union(critic.compute_values(rollout)).union(DataProto.from_dict({"returns": returns}))
            critic.update_critic(batch)

        step()
        critic.save_checkpoint(str(tmp_path))
        saved_values = critic.compute_values(rollout).batch["values"]
        saved_fingerprint = critic.state_fingerprint()[0]
        step()
        assert critic.state_fingerprint()[0] != saved_fingerprint
        critic.load_checkpoint(str(tmp_path))
        assert critic.state_fingerprint()[0] == saved_fingerprint
        assert torch.equal(critic.compute_values(rollout).batch["values"], saved_values)
        assert critic.workers[0].update_calls == 1
