"""Two ranks on a real local Ray: DDP keeps the actor's weights equal across ranks after updates."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.workers.recipes import digits_prompts, tiny_recipe
from tests.workers.test_actor import with_advantages
from workers import ActorWorker, CriticWorker


def test_two_rank_updates_keep_weights_equal_across_ranks(ray_session, tmp_path):
    recipe = tiny_recipe(roles={"actor": {"micro_batch_size": 2, "strategy": "ddp"}, "critic": {"strategy": "ddp"}})
    pool = RayResourcePool([2], name="workers-ddp")
    groups = {}
    try:
        # Colocated: both roles share one process per rank (and one torch.distributed group).
        groups = RayWorkerGroup.create_colocated(
            pool,
            {"actor": RayClassWithInitArgs(ActorWorker, recipe, "actor"),
             "critic": RayClassWithInitArgs(CriticWorker, recipe, "critic")},
        )
        actor, critic = groups["actor"], groups["critic"]
        actor.init_model()
        critic.init_model()
        initial = actor.state_fingerprint()
        assert initial[0] == initial[1]

        # 3 prompts over 2 ranks: the group pads the input, and strips n rows per padded prompt.
        rollout = actor.generate_sequences(digits_prompts(3))
        assert len(rollout) == 6 and rollout.batch["responses"].shape[1] == 8
        assert list(rollout.non_tensor_batch["uid"]) == ["p0", "p0", "p1", "p1", "p2", "p2"]

        batch = with_advantages(actor.generate_sequences(digits_prompts(4)))
        metrics = actor.update_actor(batch)
        assert metrics[0] == metrics[1]  # all-reduced: every rank reports the same numbers
        after = actor.state_fingerprint()
        assert after[0] == pytest.approx(after[1], abs=1e-9, rel=0) and after[0] != initial[0]

        values = critic.compute_values(batch)
        returns = torch.ones_like(values.batch["values"])
        critic_metrics = critic.update_critic(batch.union(values).union(DataProto.from_dict({"returns": returns})))
        assert critic_metrics[0] == critic_metrics[1]
        critic_after = critic.state_fingerprint()
        assert critic_after[0] == pytest.approx(critic_after[1], abs=1e-9, rel=0)

        # Every rank writes its part of the checkpoint (rank 0 the HF directory); both load it back.
        paths = actor.save_checkpoint(str(tmp_path))
        assert paths == [str(tmp_path / "actor")] * 2
        assert (tmp_path / "actor" / "hf" / "model.safetensors").is_file()

        actor.update_actor(with_advantages(batch, seed=1))
        actor.load_checkpoint(str(tmp_path))
        assert actor.state_fingerprint() == after
    finally:
        for group in groups.values():
            group.shutdown()
        pool.release()
