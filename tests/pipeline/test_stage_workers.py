"""The stage workers on the local backend: packing keeps demonstrations apart, the exported reward model
scores rollouts exactly where it was trained to, and a LoRA actor is its own DPO reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfctl.data.pairs import DemonstrationDataset, PreferenceDataset, collate_demonstrations, collate_policy_pairs, collate_reward_pairs
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup
from rlhfctl.tasks import get_task
from tests.workers.recipes import TINY_MODEL, tiny_recipe, tokenizer
from workers.dpo import DPOWorker
from workers.reward import RewardWorker
from workers.reward_model import RewardModelTrainerWorker
from workers.sft import SFTWorker


def group(cls: type, recipe: dict, role: str) -> LocalWorkerGroup:
    built = LocalWorkerGroup(1, ClassWithInitArgs(cls, recipe, role), role=role)
    built.init_model()
    return built


def test_packed_rows_give_the_same_loss_as_one_demonstration_per_row():
    demos = list(DemonstrationDataset(get_task("digits").make_demonstrations(6, 0), tokenizer()))
    actor = group(SFTWorker, tiny_recipe(), "actor")
    try:
        pad = tokenizer().pad_token_id
        plain = actor.eval_sft(DataProto.from_dict(collate_demonstrations(demos, pad), meta_info={"packed": False}))
        packed_batch = collate_demonstrations(demos, pad, packing=True, max_length=64)
        assert packed_batch["input_ids"].shape[0] < len(demos)
        packed = actor.eval_sft(DataProto.from_dict(packed_batch, meta_info={"packed": True}))
        assert packed.batch["tokens"].sum() == plain.batch["tokens"].sum()
        assert packed.batch["nll_sum"].sum().item() == pytest.approx(plain.batch["nll_sum"].sum().item(), rel=1e-4)
    finally:
        actor.shutdown()


def test_the_exported_reward_model_scores_rollouts_at_their_last_token(tmp_path):
    recipe = tiny_recipe(roles={"reward": {"function": None, "model": TINY_MODEL}}, algorithm={"margin": 0.0})
    trainer = group(RewardModelTrainerWorker, recipe, "reward")
    pairs = list(PreferenceDataset(get_task("digits").make_preferences(8, 0), tokenizer()))
    try:
        trainer.train_reward_model(DataProto.from_dict(collate_reward_pairs(pairs, tokenizer().pad_token_id)))
        trainer.export_hf(str(tmp_path / "model"))
        # One pair per row, unpadded: the score of each text on its own.
        alone = [trainer.eval_reward_model(DataProto.from_dict(collate_reward_pairs([pair], tokenizer().pad_token_id)))
                 for pair in pairs]
    finally:
        trainer.shutdown()
    records = get_task("digits").make_preferences(8, 0)
    scorer = group(RewardWorker, tiny_recipe(roles={"reward": {"function": None, "model": {"path": str(tmp_path / "model")}}}),
                   "reward")
    try:
        responses = [record["chosen"] for record in records]
        width = 8
        data = DataProto.from_dict(
            tensors={"responses": torch.zeros(len(records), width, dtype=torch.long),
                     "response_mask": (torch.arange(width) < torch.tensor([len(r) for r in responses])[:, None]).long()},
            non_tensors={"prompt_text": [record["prompt"] for record in records], "response_text": responses},
        )
        scored = scorer.compute_rewards(data)
    finally:
        scorer.shutdown()
    expected = np.array([float(result.batch["chosen_score"][0]) for result in alone])
    assert np.allclose(scored.non_tensor_batch["score"], expected, atol=1e-4)
    last = data.batch["response_mask"].sum(-1) - 1
    placed = scored.batch["token_level_scores"][torch.arange(len(records)), last].numpy()
    assert np.allclose(placed, expected, atol=1e-4)


def test_a_lora_actor_is_its_own_dpo_reference():
    recipe = tiny_recipe(roles={"actor": {"lora": {"r": 4}, "optim": {"lr": 1e-2}}}, algorithm={"beta": 0.1})
    actor = group(DPOWorker, recipe, "actor")
    pairs = list(PreferenceDataset(get_task("digits").make_preferences(8, 1), tokenizer()))
    tensors = collate_policy_pairs(pairs, tokenizer().pad_token_id)
    try:
        both = DataProto.from_dict({key: torch.cat([tensors[f"chosen_{key}"], tensors[f"rejected_{key}"]])
                                    for key in ("input_ids", "attention_mask", "responses")})
        ref = actor.compute_ref_log_prob(both).batch["ref_log_prob"]
        mask = torch.cat([tensors["chosen_response_mask"], tensors["rejected_response_mask"]])
        sums = (ref * mask).sum(-1)
        batch = DataProto.from_dict({**tensors, "chosen_ref_logp": sums[:8], "rejected_ref_logp": sums[8:]})
        first = actor.train_dpo(batch)[0]
        for _ in range(4):
            last = actor.train_dpo(batch)[0]
    finally:
        actor.shutdown()
    assert first["loss"] == pytest.approx(np.log(2.0), abs=1e-5)  # a fresh adapter changes nothing yet
    assert last["loss"] < first["loss"] and last["rewards/margin"] > 0
