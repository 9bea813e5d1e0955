"""The other roles under FSDP2 on two real Ray ranks: critic and reference colocated with the actor (the
reference loaded from a checkpoint directory: rank 0 reads it, rank 1 builds on the meta device and gets
its shards by broadcast), and a reward model trained sharded and exported."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.data.pairs import PreferenceDataset, collate_reward_pairs
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from rlhfctl.tasks import get_task
from tests.workers.recipes import TINY_MODEL, tiny_recipe, tokenizer
from tests.workers.test_engine import fixed_batch
from workers import ActorWorker, CriticWorker, ReferenceWorker
from workers.reward_model import RewardModelTrainerWorker


@pytest.mark.slow
def test_critic_and_reference_shard_next_to_the_actor(ray_session, tmp_path):
    from rlhfctl.models.loading import load_causal_lm, save_hf_model

    save_hf_model(load_causal_lm(TINY_MODEL, tokenizer(), seed=0), tokenizer(), tmp_path / "initial")
    recipe = tiny_recipe(roles={role: {"strategy": "fsdp2"} for role in ("actor", "critic", "reference")})
    recipe["roles"]["reference"]["model"] = {"path": str(tmp_path / "initial")}  # the actor's seed-0 weights
    pool = RayResourcePool([2], name="engine-roles")
    groups = {}
    try:
        groups = RayWorkerGroup.create_colocated(pool, {role: RayClassWithInitArgs(cls, recipe, role) for role, cls in (
            ("actor", ActorWorker), ("critic", CriticWorker), ("reference", ReferenceWorker))})
        for group in groups.values():
            group.init_model()
        batch = fixed_batch()
        reference = groups["reference"].compute_ref_log_prob(batch).batch["ref_log_prob"]
        torch.testing.assert_close(reference, groups["actor"].compute_log_prob(batch).batch["old_log_probs"])
        critic = groups["critic"]
        values = critic.compute_values(batch).batch["values"]
        update = batch.union(DataProto.from_dict({"values": values, "returns": torch.ones_like(values)}))
        before = critic.state_fingerprint()
        metrics = critic.update_critic(update)
        assert metrics[0] == metrics[1] and critic.state_fingerprint()[0] != before[0]
        after = critic.compute_values(batch).batch["values"]
        critic.save_checkpoint(str(tmp_path / "ckpt"))
        critic.update_critic(update)
        critic.load_checkpoint(str(tmp_path / "ckpt"))
        torch.testing.assert_close(critic.compute_values(batch).batch["values"], after)
        assert (tmp_path / "ckpt" / "critic" / "hf" / "config.json").is_file()
    finally:
        for group in groups.values():
            group.shutdown()
        pool.release()


@pytest.mark.slow
def test_a_sharded_reward_model_trains_exports_and_scores_sharded(ray_session, tmp_path):
    from transformers import AutoModelForSequenceClassification

    pairs = DataProto.from_dict(collate_reward_pairs(
        list(PreferenceDataset(get_task("digits").make_preferences(8, 0), tokenizer())), tokenizer().pad_token_id))
    recipe = tiny_recipe(roles={"reward": {"function": None, "model": TINY_MODEL, "strategy": "fsdp2"}})
    pool = RayResourcePool([2], name="engine-reward")
    try:
        trainer = RayWorkerGroup(pool, RayClassWithInitArgs(RewardModelTrainerWorker, recipe, "reward"), role="reward")
        trainer.init_model()
        metrics = trainer.train_reward_model(pairs)
        assert metrics[0]["grad_norm"] > 0
        scores = trainer.eval_reward_model(pairs).batch["chosen_score"]
        assert trainer.export_hf(str(tmp_path / "rm")) == str(tmp_path / "rm")
        trainer.shutdown()
    finally:
        pool.release()
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    with torch.no_grad():
        direct = model(input_ids=pairs.batch["chosen_input_ids"], attention_mask=pairs.batch["chosen_attention_mask"]).logits[:, 0]
    torch.testing.assert_close(direct, scores, atol=1e-5, rtol=1e-5)
