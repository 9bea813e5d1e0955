"""An actor that holds still at a chosen call so a test can kill it there, from outside, at a known moment.

``RLHFCTL_TEST_PAUSES=update_actor:5,generate_sequences:3`` (reaching every worker, as every RLHFCTL_*
variable does) lists pauses in order: the first holds rank ``RLHFCTL_TEST_PAUSE_RANK`` (default 0) at
its process's 5th ``update_actor`` call. A pause writes ``<RLHFCTL_TEST_PAUSE_DIR>/pause_<i>`` (the
process id) and sleeps until the test kills or stops the process; each pause happens once per run
(its file stays), and the next one waits for it, so a restarted worker counts its calls afresh.
Without the variable it is the plain ActorWorker.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rlhfctl.single_controller.decorator import get_dispatch_spec, register
from workers.actor import ActorWorker

PAUSED_S = 300.0


def _pauses() -> list[tuple[str, int]]:
    spec = os.environ.get("RLHFCTL_TEST_PAUSES", "")
    return [(name, int(count)) for name, count in (item.split(":") for item in spec.split(",") if item)]


class PausingActor(ActorWorker):
    """ActorWorker whose generate_sequences, update_actor and save_checkpoint can hold still (see the module)."""

    def _maybe_pause(self, method: str) -> None:
        calls = self.__dict__.setdefault("_test_calls", {})
        calls[method] = calls.get(method, 0) + 1
        if self.rank != int(os.environ.get("RLHFCTL_TEST_PAUSE_RANK", "0")):
            return
        folder = Path(os.environ.get("RLHFCTL_TEST_PAUSE_DIR", "."))
        for index, (name, count) in enumerate(_pauses()):
            marker = folder / f"pause_{index}"
            if marker.exists():
                continue
            if name == method and calls[method] == count:
                marker.write_text(str(os.getpid()))
                time.sleep(PAUSED_S)  # the test kills this process (or stops it) now
            return  # only the first pause not yet done is armed


def _pausing(name: str):
    parent = getattr(ActorWorker, name)
    spec = get_dispatch_spec(parent)

    def method(self, *args, **kwargs):
        self._maybe_pause(name)
        return parent(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return register(spec.dispatch_mode, spec.execute_mode, spec.blocking, spec.materialize_futures)(method)


for _name in ("generate_sequences", "update_actor", "save_checkpoint"):
    setattr(PausingActor, _name, _pausing(_name))
