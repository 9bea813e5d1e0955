"""The driver's side of the actor -> rollout weight sync (``rollout.placement: separate``).

A sync is two calls sent together: ``send_weights`` on the actor (queued behind its update) and
``receive_weights`` on the rollout group (queued behind the generations already sent, so those finish
on the weights they started with). Every ``rollout.sync_check_every``-th weight version a probe call follows the
receive, and the actor scores the probe's samples (``rollout/sync_check_diff``). Nothing here waits at
send time: the metrics of a sync are collected with the next step's. With tensor-parallel vLLM engines
(``rollout.vllm.tensor_parallel_size`` t) the rollout group's world is engines x t, and every one of its
ranks joins the channel and receives every bucket: its engine keeps its own shard of each tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlhfctl.single_controller import WorkerGroup, WorkerGroupError

__all__ = ["WeightSync"]


@dataclass
class _Sync:
    version: int
    send: Any
    receive: Any
    probe: Any | None


class WeightSync:
    """Opens the channel between the actor's rank 0 and the rollout ranks, then moves the weights when told."""

    def __init__(self, actor: WorkerGroup, rollout: WorkerGroup, check_every: int) -> None:
        self.actor, self.rollout, self.check_every = actor, rollout, int(check_every)
        self.syncs = 0
        self._pending: list[_Sync] = []

    def open(self) -> None:
        """Build the channel (both ends join at once); the first :meth:`send` gives the rollout group the actor's weights."""
        address = self.actor.open_weight_sync(self.rollout.world_size)
        joins = [self.actor.join_weight_sync.submit(address), self.rollout.join_weight_sync.submit(address)]
        for join in joins:
            join.get()

    def send(self, version: int) -> None:
        """Send the actor's weights, which are ``version``, to the rollout group (and a probe, when due)."""
        self.syncs += 1
        send = self.actor.send_weights.submit()
        receive = self.rollout.receive_weights.submit(version)
        # By version, not by this process's count: a resumed run checks the syncs the uninterrupted one did (version 0,
        # the run's first sync, included), so its metrics are the same.
        due = self.check_every > 0 and version % self.check_every == 0
        probe = self.rollout.sync_probe.submit() if due else None
        self._pending.append(_Sync(version, send, receive, probe))

    def abandon(self) -> None:
        """Forget the syncs in flight to a lost rollout group: the actor's sends finish or fail (bounded), then go."""
        pending, self._pending = self._pending, []
        for sync in pending:
            try:
                sync.send.get()
            except WorkerGroupError:  # the channel broke under the send; the actor itself goes on
                pass

    def metrics(self) -> dict[str, float]:
        """The finished syncs' readings: ``time/weight_sync`` (the transfer, from the first bucket's arrival),
        ``time/weight_sync_wait`` (the rollout ranks waiting for the actor to send), ``rollout/sync_bytes``,
        ``rollout/sync_version`` and, when checked, ``rollout/sync_check_diff``; waits for the syncs still running."""
        metrics: dict[str, float] = {}
        pending, self._pending = self._pending, []
        for sync in pending:
            received = sync.receive.get()  # first: a lost rollout rank shows here as itself, not as the actor's broken send
            sent = sync.send.get()
            if int(sent["version"]) != sync.version:  # the driver's count of updates and the actor's own disagree
                raise RuntimeError(f"the actor sent weights of version {int(sent['version'])} for sync {sync.version}")
            metrics["time/weight_sync"] = metrics.get("time/weight_sync", 0.0) + float(received["time/weight_receive"])
            metrics["time/weight_sync_wait"] = metrics.get("time/weight_sync_wait", 0.0) + float(received["time/weight_sync_wait"])
            metrics["rollout/sync_bytes"] = metrics.get("rollout/sync_bytes", 0.0) + float(sent["rollout/sync_bytes"])
            metrics["rollout/sync_version"] = float(sync.version)
            if sync.probe is not None:
                metrics.update(self.actor.check_weight_sync(sync.probe.get()))
        return metrics
