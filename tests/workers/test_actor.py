"""ActorWorker (and ReferenceWorker): log-probs, PPO updates, metrics, checkpoints."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.models.loading import load_causal_lm
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import WorkerMethodError
from tests.workers.conftest import local_group
from tests.workers.recipes import TINY_MODEL, digits_prompts, tiny_recipe, tokenizer
from workers import ActorWorker, ReferenceWorker

POLICY_METRICS = {
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "memory/actor/state_gib",
}


def direct_log_probs(model, batch, temperature: float = 1.0):
    """Log-probs and entropies of the responses from one plain forward pass."""
    width = batch.batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=batch.batch["input_ids"],
            attention_mask=batch.batch["attention_mask"],
            position_ids=batch.batch["position_ids"],
        ).logits[:, -width - 1 : -1] / temperature
    log_softmax = torch.log_softmax(logits.float(), dim=-1)
    log_probs = log_softmax.gather(-1, batch.batch["responses"][..., None]).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_probs, entropy


def with_advantages(rollout: DataProto, seed: int = 0) -> DataProto:
    """The rollout plus one random advantage per sample, broadcast over its tokens (replacing any)."""
    rollout = rollout.select([key for key in rollout.batch if key != "advantages"])
    generator = torch.Generator().manual_seed(seed)
    per_sample = torch.randn(len(rollout), 1, generator=generator)
    advantages = per_sample.expand_as(rollout.batch["response_mask"]).float() * rollout.batch["response_mask"]
    return rollout.union(DataProto.from_dict({"advantages": advantages}))


def test_compute_log_prob_equals_a_direct_forward_and_micro_batching_does_not_matter(actor_group):
    rollout = actor_group.generate_sequences(digits_prompts(3))
    model = load_causal_lm(TINY_MODEL, tokenizer(), seed=0).eval()
    expected_lp, expected_entropy = direct_log_probs(model, rollout)
    # Pad cells hold whatever the padded pass computes there and 0 padding-free: compare the tokens.
    mask = rollout.batch["response_mask"].bool()
    expected_lp, expected_entropy = expected_lp * mask, expected_entropy * mask
    result = actor_group.compute_log_prob(rollout)
    result.batch["old_log_probs"] *= mask
    result.batch["entropys"] *= mask
    assert set(result.batch) == {"old_log_probs", "entropys"}
    torch.testing.assert_close(result.batch["old_log_probs"], expected_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.batch["entropys"], expected_entropy, atol=1e-5, rtol=1e-5)

    with local_group(ActorWorker, tiny_recipe(roles={"actor": {"micro_batch_size": 4}}), "actor") as micro:
        micro_lp = micro.compute_log_prob(rollout).batch["old_log_probs"]
    torch.testing.assert_close(micro_lp * mask, expected_lp, atol=1e-5, rtol=1e-5)
    # The sampling temperature travels in meta_info and scales the logits.
    rollout.meta_info["temperature"] = 0.5
    tempered, _ = direct_log_probs(model, rollout, temperature=0.5)
    tempered, tempered_lp = tempered * mask, actor_group.compute_log_prob(rollout).batch["old_log_probs"] * mask
    torch.testing.assert_close(tempered_lp, tempered, atol=1e-5, rtol=1e-5)


def test_reference_starts_identical_to_the_actor(actor_group):
    rollout = actor_group.generate_sequences(digits_prompts(2))
    with local_group(ReferenceWorker, tiny_recipe(), "reference") as reference:
        ref = reference.compute_ref_log_prob(rollout)
    assert set(ref.batch) == {"ref_log_prob"}
    torch.testing.assert_close(ref.batch["ref_log_prob"], actor_group.compute_log_prob(rollout).batch["old_log_probs"])


def test_compute_ref_log_prob_on_a_full_finetune_actor_is_a_clear_error(actor_group):
    rollout = actor_group.generate_sequences(digits_prompts(1))
    with pytest.raises(WorkerMethodError, match="only with a LoRA actor"):
        actor_group.compute_ref_log_prob(rollout)


def test_on_policy_update_changes_weights_and_reports_metrics():
    with local_group(ActorWorker, tiny_recipe(), "actor") as actor:
        batch = with_advantages(actor.generate_sequences(digits_prompts(4)))
        before = actor.state_fingerprint()[0]
        (metrics,) = actor.update_actor(batch)  # no old_log_probs: on-policy shortcut
        assert set(metrics) == POLICY_METRICS
        assert all(isinstance(value, float) for value in metrics.values())
        assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0
        assert metrics["actor/lr"] == pytest.approx(1e-2)
        assert metrics["actor/grad_norm"] > 0
        assert actor.state_fingerprint()[0] != before


def test_ppo_epochs_mini_and_micro_batches_with_kl_loss():
    recipe = tiny_recipe(
        trainer={"ppo_epochs": 2, "mini_batch_size": 2},  # 2 prompts x n=2 = 4 of 8 rows per step
        roles={"actor": {"micro_batch_size": 3, "optim": {"lr_schedule": "linear", "warmup_steps": 1}}},
        algorithm={"kl": {"use_kl_loss": True, "loss_coef": 0.1}},
    )
    with local_group(ActorWorker, recipe, "actor") as actor, local_group(ReferenceWorker, recipe, "reference") as ref:
        rollout = with_advantages(actor.generate_sequences(digits_prompts(4)))
        with pytest.raises(WorkerMethodError, match="no old_log_probs"):
            actor.update_actor(rollout)
        batch = rollout.union(actor.compute_log_prob(rollout).select(["old_log_probs"]))
        with pytest.raises(WorkerMethodError, match="ref_log_prob"):
            actor.update_actor(batch)
        batch = batch.union(ref.compute_ref_log_prob(batch))
        (first,) = actor.update_actor(batch)
        (second,) = actor.update_actor(batch)
    assert set(first) == POLICY_METRICS | {"actor/kl_loss"}
    assert first["actor/kl_loss"] > 0  # the second mini-batch and epoch see moved weights
    assert first["actor/ppo_kl"] != 0.0
    # Warmup of one step at 1e-2 / 2, then linear decay over total_steps=10.
    assert first["actor/lr"] == pytest.approx(5e-3)
    assert second["actor/lr"] == pytest.approx(1e-2)


def optimizer_state(worker) -> dict:
    state = worker.optimizer.state_dict()
    return {key: {name: value.clone() for name, value in entry.items()} for key, entry in state["state"].items()}


def test_checkpoint_round_trip_restores_weights_optimizer_and_sampling(tmp_path):
    with local_group(ActorWorker, tiny_recipe(), "actor") as actor:
        prompts = digits_prompts(2)
        actor.update_actor(with_advantages(actor.generate_sequences(prompts)))
        (path,) = actor.save_checkpoint(str(tmp_path))
        worker = actor.workers[0]
        saved_weights = {name: p.detach().clone() for name, p in worker.module.named_parameters()}
        saved_optimizer = optimizer_state(worker)
        saved_fingerprint = actor.state_fingerprint()[0]
        next_rollout = actor.generate_sequences(prompts)

        actor.update_actor(with_advantages(next_rollout, seed=1))
        assert actor.state_fingerprint()[0] != saved_fingerprint
        actor.load_checkpoint(str(tmp_path))

        assert actor.state_fingerprint()[0] == saved_fingerprint
        for name, parameter in worker.module.named_parameters():
            assert torch.equal(parameter, saved_weights[name]), name
        restored = optimizer_state(worker)
        assert restored.keys() == saved_optimizer.keys()
        for key, entry in saved_optimizer.items():
            for name, value in entry.items():
                assert torch.equal(restored[key][name], value), (key, name)
        assert worker.scheduler.last_epoch == 1
        # Counters came back too: the next rollout repeats the one sampled right after saving.
        assert torch.equal(actor.generate_sequences(prompts).batch["responses"], next_rollout.batch["responses"])
    assert sorted(p.name for p in (tmp_path / "actor").iterdir()) == [
        "checkpoint.json", "hf", "scheduler.pt", "state", "worker_state.pt"
    ]
    assert path == str(tmp_path / "actor")


def test_export_hf_writes_a_loadable_model(tmp_path):
    from transformers import AutoModelForCausalLM

    with local_group(ActorWorker, tiny_recipe(), "actor") as actor:
        exported = actor.export_hf(str(tmp_path / "hf"))
        module = actor.workers[0].module
        loaded = AutoModelForCausalLM.from_pretrained(exported)
        ids = torch.tensor([[5, 6, 7, 8]])
        with torch.no_grad():
            torch.testing.assert_close(loaded(input_ids=ids).logits, module(input_ids=ids).logits)
