"""An actor whose update and a rollout worker whose generation take ``RLHFCTL_TEST_DELAY_S`` longer (default 0.5 s).

The staleness tests run one against the other: however long either side takes, no sample the actor
trains on may be older than ``trainer.max_staleness`` versions.
"""

from __future__ import annotations

import os
import time

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
