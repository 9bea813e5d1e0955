"""A rollout group restarted alone is sent the weights the actor holds at that moment, wherever the loss shows.

The loss shows either while a step's batch is collected (``responses``) or, after the batch is in, while the
last weight sync's readings are collected (``metrics``): in both cases the step's update has not been sent, so
the actor holds ``updates_before(step)``. The groups below run each call at once, in order, in this process;
the actor reports the updates it has taken with every send, as the real one does, and a mismatch raises.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from rlhfctl.errors import WorkerLost
from rlhfctl.models.loading import load_tokenizer
from rlhfctl.protocol import DataProto
from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.resolve import ROLLOUT_ROLE
from rlhfctl.recipe.resolved import resolve
from rlhfctl.rollout.separate import SeparateRollouts
from rlhfctl.trainer.prompt_source import build_dataset, make_batcher

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
SEPARATE = ["resource_pools.gen={process_on_nodes: [1], use_gpu: false}", "rollout.placement=separate",
            "rollout.pool=gen", "trainer.batch_size=2", "trainer.mini_batch_size=2", "data.num_train=16",
            "trainer.total_steps=5"]


class _Done:
    def __init__(self, call: Callable[[], Any]) -> None:
        try:
            self.value, self.error = call(), None
        except WorkerLost as error:
            self.value, self.error = None, error

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class _Method:
    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def __call__(self, *args: Any) -> Any:
        return self.function(*args)

    def submit(self, *args: Any) -> _Done:
        return _Done(lambda: self.function(*args))


class _Actor:
    backend, world_size = "local", 1

    def __init__(self) -> None:
        self.updates = 0
        self.open_weight_sync = _Method(lambda receivers: ("127.0.0.1", 0, 1 + receivers))
        self.join_weight_sync = _Method(lambda address: None)
        self.send_weights = _Method(lambda: {"version": float(self.updates), "rollout/sync_bytes": 1.0})
        self.check_weight_sync = _Method(lambda probe: {})


class _Rollout:
    backend, world_size = "local", 1

    def __init__(self, die_at_receive: int | None = None) -> None:
        self.version, self.receives, self.die_at_receive, self.dead = -1, 0, die_at_receive, False
        self.join_weight_sync = _Method(lambda address: None)
        self.receive_weights = _Method(self._receive)
        self.generate_sequences = _Method(self._generate)
        self.sync_probe = _Method(lambda: None)

    def _alive(self) -> None:
        if self.dead:
            error = WorkerLost("rollout rank 0 died")
            error.role = ROLLOUT_ROLE
            raise error

    def _receive(self, version: int) -> dict[str, float]:
        self.receives += 1
        if self.receives == self.die_at_receive:
            self.dead = True
        self._alive()
        self.version = version
        return {"time/weight_receive": 0.0, "time/weight_sync_wait": 0.0}

    def _generate(self, prompts: DataProto) -> DataProto:
        self._alive()
        rows = len(prompts)
        return DataProto.from_dict(tensors={"policy_version": torch.full((rows,), self.version),
                                            "input_ids": prompts.batch["input_ids"]})


class _Reward:
    backend, world_size = "local", 1
    compute_rewards = _Method(lambda batch: DataProto.from_dict(tensors={"score": torch.zeros(len(batch))}))


def _run(staleness: int, rollout: _Rollout) -> tuple[list[int], list[str]]:
    """The trainer's order of calls for five steps; the staleness of every batch trained on, and the notices."""
    recipe = resolve(load_recipe(QUICKSTART, [*SEPARATE, f"trainer.max_staleness={staleness}", "trainer.max_restarts=1"]))
    tokenizer = load_tokenizer(recipe.role("actor").model, trust_remote_code=False)
    batcher = make_batcher(build_dataset(recipe, tokenizer, "train"), recipe)
    actor, notices = _Actor(), []
    rollouts = SeparateRollouts(recipe, batcher, tokenizer, rollout, actor, _Reward(), None, None,
                                restart=lambda: _Rollout(), notify=notices.append)
    rollouts.start(0)
    ages = []
    for step in range(1, 6):
        batch = rollouts.next()
        generated = batch.responses()
        batch.metrics()  # the syncs' readings: raises on a version mismatch
        ages.append(rollouts.schedule.updates_before(step) - int(generated.batch["policy_version"].max()))
        actor.updates += 1  # the update is sent (and, in this process, taken) before the next batches
        rollouts.send_ahead(step)
    return ages, notices


@pytest.mark.parametrize("staleness", [0, 1, 2])
@pytest.mark.parametrize("die_at_receive", [2, 3])
def test_a_rollout_group_lost_in_a_sync_is_sent_the_actors_current_weights(staleness, die_at_receive):
    ages, notices = _run(staleness, _Rollout(die_at_receive=die_at_receive))
    assert len(notices) == 1 and "rollout group restart 1/1" in notices[0]
    assert max(ages) <= staleness
    if staleness == 0:
        assert ages == [0] * 5  # on-policy stays on-policy across the restart


def test_a_run_without_a_loss_matches_the_bound():
    for staleness in (0, 1, 2):
        ages, notices = _run(staleness, _Rollout())
        assert notices == [] and max(ages) <= staleness
