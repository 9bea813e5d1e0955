"""The staleness schedule bounds every sample's age by trainer.max_staleness, whatever the timing.

The rollout group runs its calls in the order they are sent, so a batch is generated from the weights of
the last sync sent before it. The simulation below replays the trainer's sends (``SeparateRollouts``'s
rule) and checks the age of every batch trained on, for every k, sync interval and critic warm-up.
"""

from __future__ import annotations

import itertools

import pytest

from rlhfctl.rollout.staleness import StalenessSchedule


def _replay(schedule: StalenessSchedule) -> tuple[list[int], int]:
    """The age of each step's batch, and the most batches ever in flight."""
    synced, next_unsent, in_flight, most = 0, 1, [], 0

    def fill() -> None:
        nonlocal next_unsent, most
        while schedule.may_send(next_unsent, synced, len(in_flight)):
            in_flight.append(synced)  # generated from the weights of the last sync sent before it
            next_unsent += 1
        most = max(most, len(in_flight))

    fill()
    ages = []
    for step in range(1, schedule.total_steps + 1):
        assert in_flight, f"step {step} has no batch"
        ages.append(schedule.updates_before(step) - in_flight.pop(0))
        actor_version = schedule.updates_before(step + 1)
        if schedule.needs_sync(actor_version, synced, next_unsent):
            synced = actor_version
        fill()
    return ages, most


@pytest.mark.parametrize("k, sync_every, warmup", list(itertools.product(range(4), range(1, 4), range(3))))
def test_no_batch_is_older_than_the_bound_and_the_pipeline_fills(k, sync_every, warmup):
    schedule = StalenessSchedule(max_staleness=k, sync_every=sync_every, total_steps=12, critic_warmup_steps=warmup)
    ages, most = _replay(schedule)
    assert len(ages) == 12 and max(ages) <= k and min(ages) >= 0
    assert most <= k + 1
    if sync_every == 1:  # weights move after every update: the bound is reached once the pipeline is full
        assert ages[-1] == k and most == k + 1


def test_on_policy_means_every_batch_from_the_weights_that_train_on_it():
    ages, most = _replay(StalenessSchedule(max_staleness=0, sync_every=3, total_steps=6))
    assert ages == [0] * 6 and most == 1  # sync_every cannot delay a sync the bound needs


def test_one_step_off_policy_ages():
    schedule = StalenessSchedule(max_staleness=1, sync_every=1, total_steps=5)
    assert _replay(schedule) == ([0, 1, 1, 1, 1], 2)
    assert not schedule.may_send(6, synced_version=5)  # nothing past the last step
