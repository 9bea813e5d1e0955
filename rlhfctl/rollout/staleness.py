"""The staleness bound of asynchronous rollout, as a pure schedule: when a step's batch may be sent, when weights must move.

Versions count the actor's updates: the weights that train step ``s`` are version ``updates_before(s)``.
A generation call is queued on the rollout group behind every weight sync sent before it, so it
generates from at least the last synced version. Sending step ``s``'s batch only once the synced version
is at least ``updates_before(s) - k`` therefore bounds the age of every sample trained on by ``k``:

    staleness(s) = updates_before(s) - version_generated <= updates_before(s) - synced_version <= k.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StalenessSchedule", "updates_before"]


def updates_before(step: int, critic_warmup_steps: int = 0) -> int:
    """The policy version that trains step ``step`` (from 1): the actor's updates before it (none during the critic's
    warmup), the count every version in a run is measured in."""
    return max(0, step - 1 - critic_warmup_steps)


@dataclass(frozen=True)
class StalenessSchedule:
    """``trainer.max_staleness`` (k), ``rollout.sync_every`` and the steps that do not update the actor (critic warmup)."""

    max_staleness: int
    sync_every: int
    total_steps: int
    critic_warmup_steps: int = 0

    def updates_before(self, step: int) -> int:
        """The actor's version when step ``step`` (from 1) trains: the updates of the steps before it."""
        return updates_before(step, self.critic_warmup_steps)

    def may_send(self, step: int, synced_version: int, in_flight: int = 0) -> bool:
        """Whether step ``step``'s batch may be generated now, with the rollout group at ``synced_version`` and
        ``in_flight`` batches sent but not yet trained on (at most ``k + 1``: this step's and k ahead)."""
        fresh_enough = synced_version >= self.updates_before(step) - self.max_staleness
        return step <= self.total_steps and in_flight <= self.max_staleness and fresh_enough

    def needs_sync(self, actor_version: int, synced_version: int, next_unsent: int) -> bool:
        """Whether to send the weights now: ``sync_every`` updates have passed, or the next batch waits for them."""
        if actor_version <= synced_version or next_unsent > self.total_steps:
            return False  # nothing left to generate (validation syncs for itself)
        if actor_version - synced_version >= self.sync_every:
            return True
        return next_unsent <= self.total_steps and not self.may_send(next_unsent, synced_version)
