"""Checkpoints keep every rank's RNG state: each rank resumes its own stream, also on a new world size."""

from __future__ import annotations

import random

import numpy as np
import torch

from rlhfctl.single_controller import Dispatch, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, register
from tests.workers.recipes import tiny_recipe
from workers import ActorWorker
from rlhfctl.engine.seeding import capture_rng_state, rng_state_for_rank


class DrawingActor(ActorWorker):
    """An actor that can show the next numbers of its process's global generators."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def draw(self) -> tuple[float, float, float]:
        return torch.rand(1).item(), float(np.random.rand()), random.random()


def _group(pool: RayResourcePool) -> RayWorkerGroup:
    group = RayWorkerGroup(pool, RayClassWithInitArgs(DrawingActor, tiny_recipe(), "actor"), role="actor")
    group.init_model()
    return group


def test_each_rank_resumes_its_own_rng_stream_on_two_ranks_and_on_one(ray_session, tmp_path):
    pools = [RayResourcePool([2], name="rng-two"), RayResourcePool([1], name="rng-one")]
    groups = []
    try:
        two = _group(pools[0])
        groups.append(two)
        two.draw()  # move the streams on from their start-up seeds
        two.save_checkpoint(str(tmp_path))
        expected = two.draw()
        assert expected[0] != expected[1]  # the ranks have streams of their own
        two.draw()
        two.load_checkpoint(str(tmp_path))
        assert two.draw() == expected  # rank 1 gets rank 1's state back, not rank 0's

        one = _group(pools[1])  # fewer ranks: rank 0 still finds its own state
        groups.append(one)
        one.load_checkpoint(str(tmp_path))
        assert one.draw() == [expected[0]]
    finally:
        for group in groups:
            group.shutdown()
        for pool in pools:
            pool.release()


def test_a_rank_the_saving_run_did_not_have_keeps_its_own_seed():
    states = [capture_rng_state(), capture_rng_state()]
    saved = {"rng": states[0], "rank_rng": states}
    assert rng_state_for_rank(saved, 1) is states[1]
    assert rng_state_for_rank(saved, 2) is None  # resumed on three ranks: rank 2 keeps its start-up seed
    old_format = {"rng": states[0]}  # written before per-rank states were kept
    assert rng_state_for_rank(old_format, 0) is states[0] and rng_state_for_rank(old_format, 1) is None
