"""Agent rollouts in the actor (hf engine), and every consumer of a loss mask with holes: the actor's
log-probs equal the engine's, the batch has the rollout layout, the loss ignores mask-0 positions,
rewards land on the last policy token and see the conversation, metrics and samples count real tokens."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.trainer.metrics import batch_metrics
from rlhfctl.trainer.samples import SampleLog
from tests.workers.conftest import actor_group, local_group  # noqa: F401 - actor_group: a single-turn actor fixture
from tests.workers.recipes import digits_prompts, tiny_recipe, tokenizer
from workers import ActorWorker, RewardWorker
from workers.reward import place_scores

WIDTH = 48
AGENT = {
    "enable": True, "max_turns": 3, "max_response_tokens": WIDTH, "max_tool_response_tokens": 16,
    "format": "test_always_echo", "tools": [{"class": "tests.agents.test_agent_loop:EchoTool", "config": {}}],
}


def agent_recipe(reward: str = "rlhfctl.tasks.digits:score") -> dict[str, Any]:
    return tiny_recipe(rollout={"max_new_tokens": 6, "multi_turn": AGENT},
                       roles={"actor": {"entropy_coeff": 0.01}, "reward": {"function": reward}},
                       algorithm={"kl": {"use_kl_loss": True, "loss_coef": 0.1, "loss_kind": "k3"}})


@pytest.fixture(scope="module")
def agent_actor():
    with local_group(ActorWorker, agent_recipe(), "actor") as group:
        yield group


@pytest.fixture(scope="module")
def rollout(agent_actor) -> DataProto:
    return agent_actor.generate_sequences(digits_prompts(4))


def test_the_agent_batch_has_the_rollout_layout_plus_the_conversation(rollout, actor_group):
    single = actor_group.generate_sequences(digits_prompts(4))
    assert set(rollout.batch.keys()) == set(single.batch.keys()) | {"rollout_log_probs"}
    rows, prompt_width = 8, single.batch["prompts"].shape[1]
    assert rollout.batch["responses"].shape == (rows, WIDTH) and rollout.batch["input_ids"].shape == (rows, prompt_width + WIDTH)
    assert torch.equal(rollout.batch["prompts"], single.batch["prompts"])  # n samples per prompt, consecutive
    for column in ("messages", "tool_rewards", "num_turns", "reward_extra", "response_text", "uid", "agent/tool_calls",
                   "agent/tool_errors", "agent/tool_latency_s", "agent/truncated", "agent/tool_metrics"):
        assert column in rollout.non_tensor_batch, column
    assert rollout.meta_info["temperature"] == 1.0


def test_tool_tokens_are_attended_context_with_loss_mask_0(rollout):
    tok = tokenizer()
    mask, responses = rollout.batch["response_mask"], rollout.batch["responses"]
    real = rollout.batch["attention_mask"][:, -WIDTH:]
    assert bool((mask <= real).all()) and bool((real - mask).sum() > 0)  # holes in the loss mask, not in attention
    for row in range(len(rollout)):
        length = int(real[row].sum())
        assert bool(real[row, :length].all()) and not bool(real[row, length:].any())  # real tokens: a prefix
        holes = responses[row, :length][mask[row, :length] == 0].tolist()
        if holes:
            assert tok.decode(holes).startswith("\ntool: echo:hi\nassistant: ")
        assert rollout.non_tensor_batch["response_text"][row] == tok.decode(responses[row, :length].tolist(), skip_special_tokens=True)
        messages = rollout.non_tensor_batch["messages"][row]
        assert messages[0]["role"] == "user" and messages[1]["role"] == "assistant"
        assert rollout.non_tensor_batch["num_turns"][row] == sum(m["role"] == "assistant" for m in messages)
        # every call ran and was rewarded, its output shown when it fitted the budget
        calls = rollout.non_tensor_batch["agent/tool_calls"][row]
        assert rollout.non_tensor_batch["tool_rewards"][row] == 0.5 * calls >= 0.5 * sum(m["role"] == "tool" for m in messages)
        assert mask[row, length - 1] == 1  # a trajectory ends on the policy's own token


def test_the_actors_log_probs_at_policy_tokens_equal_the_engines(agent_actor, rollout):
    scored = agent_actor.compute_log_prob(rollout)
    mask = rollout.batch["response_mask"].bool()
    diff = (scored.batch["old_log_probs"] - rollout.batch["rollout_log_probs"]).abs()[mask]
    assert diff.numel() > 0 and float(diff.max()) <= 1e-3, float(diff.max())
    assert bool((rollout.batch["rollout_log_probs"][~mask] == 0).all())


def _loss_inputs(agent_actor, rollout) -> dict[str, torch.Tensor]:
    scored = agent_actor.compute_log_prob(rollout)
    generator = torch.Generator().manual_seed(0)
    mask = rollout.batch["response_mask"]
    return {
        **{key: rollout.batch[key] for key in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")},
        "old_log_probs": scored.batch["old_log_probs"] - 0.05 * mask,
        "ref_log_prob": scored.batch["old_log_probs"] + 0.1 * torch.rand(mask.shape, generator=generator),
        "advantages": torch.randn(mask.shape, generator=generator) * mask,
    }


def _gradients(worker, micro, perturb) -> list[torch.Tensor]:
    import workers.actor as actor_module

    original = actor_module.sequence_log_probs

    def scored(*args, **kwargs):
        log_probs, entropy = original(*args, **kwargs)
        return perturb(log_probs), perturb(entropy)

    worker.model.zero_grad(set_to_none=True)
    actor_module.sequence_log_probs = scored
    try:
        loss, _ = worker._policy_loss(micro, on_policy=False, use_kl=True, temperature=1.0, padding_free=False)
    finally:
        actor_module.sequence_log_probs = original
    loss.backward()
    grads = [p.grad.detach().clone() for p in worker.model.parameters() if p.grad is not None]
    worker.model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_the_loss_does_not_depend_on_the_log_probs_at_mask_0_positions(agent_actor, rollout, agg):
    """What is invariant: the tool tokens are context (they change the later tokens' log-probs), but the scores
    *at* mask-0 positions (their log-probs, entropies, old/ref log-probs and advantages) never reach the policy
    loss, the KL loss or the entropy bonus. Perturbing all of them there leaves the loss's gradient unchanged."""
    worker = agent_actor.workers[0]
    worker.config = dataclasses.replace(worker.config, loss_agg_mode=agg)
    micro = _loss_inputs(agent_actor, rollout)
    hole = (micro["response_mask"] == 0) & (micro["attention_mask"][:, -WIDTH:] == 1)
    assert bool(hole.any())
    generator = torch.Generator().manual_seed(1)
    noise = torch.randn(hole.shape, generator=generator) * 5

    def garbage(values):  # other values, and another gradient path, at the holes
        return torch.where(hole, values * 3.0 + noise, values)

    baseline = _gradients(worker, micro, lambda values: values)
    perturbed_micro = {**micro, **{key: garbage(micro[key]) for key in ("old_log_probs", "ref_log_prob", "advantages")}}
    perturbed = _gradients(worker, perturbed_micro, garbage)
    worker.config = dataclasses.replace(worker.config, loss_agg_mode="token-mean")
    assert baseline and len(baseline) == len(perturbed)
    assert any(float(g.abs().max()) > 0 for g in baseline)
    for a, b in zip(baseline, perturbed):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    # and the holes do matter as context: changing a tool token changes the next policy tokens' log-probs
    changed = dict(micro)
    row, column = [int(i) for i in hole.nonzero()[0]]
    changed["input_ids"] = micro["input_ids"].clone()
    changed["input_ids"][row, -WIDTH + column] = (int(changed["input_ids"][row, -WIDTH + column]) + 7) % 90 + 3
    before = agent_actor.compute_log_prob(DataProto.from_dict({k: micro[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}))
    after = agent_actor.compute_log_prob(DataProto.from_dict({k: changed[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}))
    later = micro["response_mask"][row].bool() & (torch.arange(WIDTH) > column)
    assert bool((before.batch["old_log_probs"][row] - after.batch["old_log_probs"][row]).abs()[later].max() > 0)


def test_the_score_lands_on_the_last_policy_token_of_a_holed_mask():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 1, 1, 1, 1]])
    placed = place_scores(torch.tensor([1.0, 2.0, 3.0, 4.0]), mask)
    assert placed.nonzero().tolist() == [[0, 4], [1, 2], [2, 0], [3, 6]]
    assert placed.sum(-1).tolist() == [1.0, 2.0, 3.0, 4.0]


def _scored(batch: DataProto) -> DataProto:
    mask = batch.batch["response_mask"].float()
    tensors = {"token_level_scores": place_scores(torch.ones(len(batch)), batch.batch["response_mask"]),
               "advantages": mask * 0.5, "returns": mask}
    return batch.union(DataProto.from_dict(tensors))


def test_lengths_count_every_real_token_and_the_agent_metrics_are_logged(rollout):
    metrics = batch_metrics(_scored(rollout))
    real = rollout.batch["attention_mask"][:, -WIDTH:].float().sum(-1)
    assert metrics["response_length/mean"] == pytest.approx(float(real.mean()))
    prompt = rollout.batch["attention_mask"][:, :-WIDTH].float().sum(-1)
    assert metrics["prompt_length/mean"] == pytest.approx(float(prompt.mean()), abs=1e-5)
    assert metrics["agent/policy_tokens/mean"] == pytest.approx(float(rollout.batch["response_mask"].float().sum(-1).mean()))
    columns = rollout.non_tensor_batch
    assert metrics["agent/turns/mean"] == pytest.approx(float(np.mean(columns["num_turns"])))
    assert metrics["agent/tool_calls/mean"] == pytest.approx(float(np.mean(columns["agent/tool_calls"])))
    assert metrics["agent/tool_calls/mean"] > 0
    assert metrics["agent/tool_errors/mean"] == 0.0
    assert metrics["agent/tool_latency_s/mean"] >= 0.0
    assert 0.0 <= metrics["agent/truncated_fraction"] <= 1.0
    assert metrics["agent/tool/echo/chars/mean"] == 2.0


def test_single_turn_metrics_have_no_agent_keys(actor_group):
    single = actor_group.generate_sequences(digits_prompts(2))
    metrics = batch_metrics(_scored(single))
    assert not [key for key in metrics if key.startswith("agent/")]
    assert metrics["response_length/mean"] == pytest.approx(float(single.batch["response_mask"].float().sum(-1).mean()))


def conversation_reward(prompts, responses, ground_truth, messages, tool_rewards):
    """A reward that reads the conversation: 1 per tool turn, plus the tools' rewards."""
    return [sum(m["role"] == "tool" for m in chat) + reward for chat, reward in zip(messages, tool_rewards)]


def plain_reward(prompts, responses, ground_truth):
    """A single-turn reward: no conversation keywords, no **kwargs."""
    return [float(len(r)) for r in responses]


def kwargs_reward(prompts, responses, **columns):
    return [float(len(columns["messages"][i]) + columns["num_turns"][i]) for i in range(len(responses))]


@pytest.mark.parametrize("function", ["conversation_reward", "plain_reward", "kwargs_reward"])
def test_reward_functions_get_the_conversation_only_when_they_take_it(rollout, function):
    recipe = agent_recipe(reward=f"tests.agents.test_agent_rollout:{function}")
    with local_group(RewardWorker, recipe, "reward") as group:
        scored = group.compute_rewards(rollout)
    columns = rollout.non_tensor_batch
    expected = {
        "conversation_reward": [sum(m["role"] == "tool" for m in chat) + reward
                                for chat, reward in zip(columns["messages"], columns["tool_rewards"])],
        "plain_reward": [float(len(text)) for text in columns["response_text"]],
        "kwargs_reward": [len(chat) + turns for chat, turns in zip(columns["messages"], columns["num_turns"])],
    }[function]
    assert scored.non_tensor_batch["score"].tolist() == pytest.approx(expected)
    last = rollout.batch["response_mask"].shape[1] - 1 - rollout.batch["response_mask"].flip(-1).argmax(-1)
    assert scored.batch["token_level_scores"].nonzero()[:, 1].tolist() == [
        int(c) for c, s in zip(last, expected) if s != 0]


def test_samples_log_whole_conversations_with_the_tool_turns_marked(rollout, tmp_path):
    class Loggers:
        def __init__(self):
            self.texts = []

        def text(self, step, name, texts):
            self.texts += texts

    log, loggers = SampleLog(tmp_path, 1, tokenizer()), Loggers()
    log.take(_scored(rollout))
    log.write(1, loggers)
    (record,) = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [m["role"] for m in record["messages"]][:3] == ["user", "assistant", "tool"]
    assert record["messages"][2] == {"role": "tool", "name": "echo", "content": "echo:hi"}
    assert record["tool_rewards"] >= 0.5
    assert "[tool echo] 'echo:hi'" in loggers.texts[0] and "-> call echo" in loggers.texts[0]


def test_greedy_validation_rollouts_run_the_agent_loop_too(agent_actor):
    out = agent_actor.generate_sequences(digits_prompts(2, do_sample=False, n=1, validate=True))
    assert len(out) == 2 and out.batch["responses"].shape[1] == WIDTH
    again = agent_actor.generate_sequences(digits_prompts(2, do_sample=False, n=1, validate=True))
    assert torch.equal(out.batch["responses"], again.batch["responses"])  # greedy: the same trajectories


def test_packed_and_padded_passes_score_a_holed_batch_alike(agent_actor, rollout):
    """Padding-free packing keeps every attended token (tool outputs too) and drops only the pads."""
    from rlhfctl.engine.log_probs import response_log_probs

    worker = agent_actor.workers[0]
    batch = {key: rollout.batch[key] for key in ("input_ids", "attention_mask", "position_ids", "responses")}
    packed, _ = response_log_probs(worker.module, batch, device=worker.device, padding_free=True, with_entropy=False)
    padded, _ = response_log_probs(worker.module, batch, device=worker.device, padding_free=False, with_entropy=False)
    real = rollout.batch["attention_mask"][:, -WIDTH:].bool()
    torch.testing.assert_close(packed[real], padded[real], rtol=1e-5, atol=1e-5)
    mask = rollout.batch["response_mask"].bool()
    assert float((packed - rollout.batch["rollout_log_probs"]).abs()[mask].max()) <= 1e-3


def test_the_policy_tokens_of_each_row_are_the_tokens_the_hf_engine_generated(agent_actor, monkeypatch):
    import rlhfctl.rollout.generator as generator_module  # the actor generates through its Generator

    generated: dict[int, list[int]] = {}
    original = generator_module.hf_batch_generate

    def recording(*args, **kwargs):
        inner = original(*args, **kwargs)

        def generate(requests):
            results = inner(requests)
            for request, result in zip(requests, results):
                generated.setdefault(request.order, []).extend(result.token_ids)
            return results

        return generate

    monkeypatch.setattr(generator_module, "hf_batch_generate", recording)
    out = agent_actor.generate_sequences(digits_prompts(2))
    mask = out.batch["response_mask"].bool()
    for row in range(len(out)):
        assert out.batch["responses"][row][mask[row]].tolist() == generated[row]
