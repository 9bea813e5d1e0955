"""Workers and a reporter that stop the driver at a chosen point of a step, for the exact-resume tests.

A test writes ``<trainer.output_dir>/stop_plan.json``: ``{"pid": driver pid, "at": "actor.update_actor",
"call": 1, "signals": [15]}``. The first process to reach its ``call``-th call of ``at`` (rank 0) sends each
signal in ``signals`` to the driver, then holds the call for a moment, so the driver handles them while it
waits for this very call; ``"exit": true`` ends the process instead (a worker lost). ``at`` may also be
``driver.step_started`` (the reporter, with ``call`` the step): before anything of that step is sent. A plan
fires once: it is renamed ``stop_plan.fired``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from rlhfctl.single_controller.decorator import get_dispatch_spec, register
from workers.actor import ActorWorker
from workers.reference import ReferenceWorker
from workers.reward import RewardWorker
from workers.rollout_worker import RolloutWorker

PLAN = "stop_plan.json"
HOLD_S = 2.0
SIGNAL_GAP_S = 2.5


def write_plan(output_dir: Path, at: str, call: int, signals: list[int] = (), exit: bool = False) -> None:
    """Arm one stop for the next run in ``output_dir``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    plan = {"pid": os.getpid(), "at": at, "call": call, "signals": [int(s) for s in signals], "exit": exit}
    (output_dir / PLAN).write_text(json.dumps(plan))


def fired(output_dir: Path) -> bool:
    return (output_dir / "stop_plan.fired").exists()


def _fire(output_dir: Path, at: str, call: int) -> None:
    path = output_dir / PLAN
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if plan["at"] != at or plan["call"] != call:
        return
    try:
        path.rename(output_dir / "stop_plan.fired")  # once, whoever gets there first
    except OSError:
        return
    if plan["exit"]:
        os._exit(1)
    for signum in plan["signals"]:
        os.kill(plan["pid"], signum)
        # Apart by more than Ray's signal check (1 s) while the driver waits: two signals pending at once reach
        # Python's handler as one.
        time.sleep(SIGNAL_GAP_S)
    time.sleep(HOLD_S)


class _Counting:
    """Counts each wrapped method's calls in this process and fires a plan that names one (rank 0)."""

    def _stop_point(self, name: str) -> None:
        calls = self.__dict__.setdefault("_stop_calls", {})
        calls[name] = calls.get(name, 0) + 1
        if self.rank == 0:
            output_dir = Path(self.recipe["trainer"]["output_dir"])
            _fire(output_dir, f"{self.role}.{name}", calls[name])


def _with_stop_point(base: type, name: str) -> Any:
    parent = getattr(base, name)
    spec = get_dispatch_spec(parent)

    def method(self, *args, **kwargs):
        self._stop_point(name)
        return parent(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return register(spec.dispatch_mode, spec.execute_mode, spec.blocking, spec.materialize_futures)(method)


def _stopping(base: type, names: tuple[str, ...]) -> type:
    cls = type(f"Stopping{base.__name__}", (_Counting, base), {"__module__": __name__})
    for name in names:
        setattr(cls, name, _with_stop_point(base, name))
    return cls


StoppingActor = _stopping(ActorWorker, ("generate_sequences", "update_actor", "save_checkpoint"))
StoppingReference = _stopping(ReferenceWorker, ("compute_ref_log_prob",))
StoppingReward = _stopping(RewardWorker, ("compute_rewards",))
StoppingRollout = _stopping(RolloutWorker, ("generate_sequences",))


class StopReporter:
    """A silent reporter that fires a ``driver.step_started`` plan and keeps the run's messages."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir, self.messages = output_dir, []

    def step_started(self, step: int, total: int) -> None:
        _fire(self.output_dir, "driver.step_started", step)

    def message(self, text: str, *args: Any) -> None:
        self.messages.append(text)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGUSR1": signal.SIGUSR1, "SIGINT": signal.SIGINT}
