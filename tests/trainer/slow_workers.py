"""Test workers for the separate rollout group: slow ones, and one that dies.

An actor whose update and a rollout worker whose generation take ``RLHFCTL_TEST_DELAY_S`` longer
(default 0.5 s): the staleness tests run one against the other, and however long either side takes, no
sample the actor trains on may be older than ``trainer.max_staleness`` versions. ``DyingRollout`` kills
its own process at its third generation call, once (the marker file ``died`` beside
``trainer.output_dir`` stays, so its replacement lives), as a lost node would.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from rlhfctl.single_controller.decorator import get_dispatch_spec, register
from workers.actor import ActorWorker
from workers.rollout_worker import RolloutWorker


def _delayed(cls: type, name: str):
    parent = getattr(cls, name)
    spec = get_dispatch_spec(parent)

    def method(self, *args, **kwargs):
        time.sleep(float(os.environ.get("RLHFCTL_TEST_DELAY_S", "0.5")))
        return parent(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return register(spec.dispatch_mode, spec.execute_mode, spec.blocking, spec.materialize_futures)(method)


class SlowUpdateActor(ActorWorker):
    """ActorWorker whose update_actor sleeps first."""


class SlowRollout(RolloutWorker):
    """RolloutWorker whose generate_sequences sleeps first."""


SlowUpdateActor.update_actor = _delayed(ActorWorker, "update_actor")
SlowRollout.generate_sequences = _delayed(RolloutWorker, "generate_sequences")


class DyingRollout(RolloutWorker):
    """RolloutWorker whose process kills itself once, at its ``DIE_AT``-th generate_sequences."""

    DIE_AT = 3


def _dying(name: str):
    parent = getattr(RolloutWorker, name)
    spec = get_dispatch_spec(parent)

    def method(self, *args, **kwargs):
        self.__dict__["_test_calls"] = self.__dict__.get("_test_calls", 0) + 1
        marker = Path(self.recipe["trainer"]["output_dir"]).parent / "died"
        if self._test_calls == self.DIE_AT and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return parent(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return register(spec.dispatch_mode, spec.execute_mode, spec.blocking, spec.materialize_futures)(method)


DyingRollout.generate_sequences = _dying("generate_sequences")
