"""A stop signal is named in the message and the exit code, whatever the driver sees first.

A signal handled while the driver waits inside Ray does not surface as the handler's RunSignalled:
Ray's signal check (``check_signals`` in ray/_raylet.pyx) runs the Python handler, catches the
KeyboardInterrupt it raised, and ``ray.get`` raises a bare ``KeyboardInterrupt()`` instead. And when a
scheduler signals every process of the job, a worker can die of the same signal before the driver's
handler has run. These tests force each order without timing luck: the signal is sent to this process
from inside the code that stands for Ray's wait, so the handler runs exactly there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import rlhfctl.trainer.run as run
from rlhfctl.cli.errors import exit_code_for
from rlhfctl.recipe.resolved import resolve_mapping
from rlhfctl.run_signals import RunSignalled, safe_point_pending, stop_on_signals
from rlhfctl.single_controller.errors import WorkerDiedError
from rlhfctl.trace import TraceRecorder
from tests.reliability.test_faults import REPO, sigint_not_ignored
from tests.reliability.test_signals import ray_tmpdir  # noqa: F401 - the fixture


def signalled_inside_a_ray_wait(signum: int) -> None:
    """What ``ray.get`` does with a signal that arrives while it waits: the handler's exception becomes a bare one."""
    try:
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler runs here at the latest
    except KeyboardInterrupt:
        raise KeyboardInterrupt() from None  # ray: check_signals -> Status::Interrupted -> KeyboardInterrupt()
    raise AssertionError(f"signal {signum} never arrived")


def workers_die_of_the_signal_too(signum: int) -> None:
    """The signal reached the workers as well: Ray's wait swallowed the handler's stop and found a dead worker."""
    try:
        os.kill(os.getpid(), signum)
        time.sleep(5)
    except KeyboardInterrupt:
        pass
    raise WorkerDiedError("actor", "update_actor", 0, "the actor died unexpectedly")


class Reporter:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def message(self, text: str) -> None:
        self.messages.append(text)

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class Groups:
    def __init__(self) -> None:
        self.groups: dict[str, Any] = {}

    def all(self) -> list:
        return []


class Trainer:
    """Two steps done, none saved; ``fit``, ``save`` and ``shutdown`` do what the test says and are recorded."""

    def __init__(self, fit: Callable[[], None], on_save: Callable[[], None] = lambda: None,
                 on_shutdown: Callable[[], None] = lambda: None) -> None:
        self.groups, self.output_dir = Groups(), Path("unused")
        self.completed_step, self.saved_step = 2, 0
        self._fit, self._on_save, self._on_shutdown = fit, on_save, on_shutdown
        self.saved: list[int] = []
        self.shut_down = False
        self.trace = TraceRecorder()  # a restart hands it to the next attempt, as TrainerBase's

    def setup(self) -> None:
        pass

    def fit(self) -> None:
        self._fit()

    def save(self, step: int) -> None:
        self._on_save()
        self.saved.append(step)
        self.saved_step = step

    def wait_for_checkpoint(self) -> None:
        return None

    def write_trace(self) -> None:
        return None

    def shutdown(self) -> None:
        self._on_shutdown()
        self.shut_down = True


class Session:
    shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


def train(monkeypatch: pytest.MonkeyPatch, trainer: Trainer) -> tuple[BaseException, Reporter, Session]:
    """Run the real ``_train`` around ``trainer`` under :func:`stop_on_signals`; returns what left it."""
    cfg = OmegaConf.create({"trainer": {"live_progress": False, "total_steps": 10, "save_on_interrupt": True},
                            "ray": {"backend": "ray"}})
    recipe = trainer.recipe = resolve_mapping(OmegaConf.to_container(cfg))  # what the run and the trainer read
    monkeypatch.setattr(run, "make_trainer", lambda cfg, reporter, recipe: trainer)
    reporter, session = Reporter(), Session()
    with pytest.raises(BaseException) as raised, sigint_not_ignored(), stop_on_signals():
        run._train(cfg, recipe, reporter, session)
    return raised.value, reporter, session


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_stop_signal_handled_inside_a_ray_wait_saves_and_exits_with_its_own_code(monkeypatch, signum):
    trainer = Trainer(fit=lambda: signalled_inside_a_ray_wait(signum))
    error, reporter, session = train(monkeypatch, trainer)
    assert isinstance(error, RunSignalled) and exit_code_for(error) == 128 + signum
    assert str(error) == f"stopped by {signal.Signals(signum).name}"
    assert f"stopped by {signal.Signals(signum).name}: saving step 2 before exiting" in reporter.messages
    assert trainer.saved == [2] and trainer.shut_down and session.shut_down


def test_ctrl_c_handled_inside_a_ray_wait_still_exits_130():
    with pytest.raises(KeyboardInterrupt) as raised, sigint_not_ignored(), stop_on_signals():
        signalled_inside_a_ray_wait(signal.SIGINT)
    assert not isinstance(raised.value, RunSignalled) and exit_code_for(raised.value) == 130


def test_ctrl_c_saves_as_interrupted_and_a_sigterm_during_the_save_does_not_cut_it(monkeypatch):
    trainer = Trainer(fit=lambda: signalled_inside_a_ray_wait(signal.SIGINT),
                      on_save=lambda: os.kill(os.getpid(), signal.SIGTERM))
    error, reporter, session = train(monkeypatch, trainer)
    assert not isinstance(error, RunSignalled) and exit_code_for(error) == 130  # the first request wins
    assert "interrupted: saving step 2 before exiting" in reporter.messages
    assert trainer.saved == [2] and trainer.shut_down and session.shut_down


def test_workers_that_die_of_the_same_sigterm_end_the_run_with_143_not_as_a_lost_worker(monkeypatch):
    trainer = Trainer(fit=lambda: workers_die_of_the_signal_too(signal.SIGTERM))
    error, reporter, session = train(monkeypatch, trainer)
    assert isinstance(error, RunSignalled) and exit_code_for(error) == 143
    assert isinstance(error.__cause__, WorkerDiedError)
    assert any(m.startswith("stopped by SIGTERM: worker process for actor rank 0 died") for m in reporter.messages)
    assert trainer.saved == [] and trainer.shut_down and session.shut_down  # nothing left to save on


def test_a_sigterm_that_arrives_after_a_lost_worker_waits_for_the_shutdown_then_exits_143(monkeypatch):
    def lost() -> None:
        raise WorkerDiedError("actor", "update_actor", 0)

    trainer = Trainer(fit=lost, on_shutdown=lambda: os.kill(os.getpid(), signal.SIGTERM))
    error, _, session = train(monkeypatch, trainer)
    assert isinstance(error, RunSignalled) and exit_code_for(error) == 143
    assert trainer.shut_down and session.shut_down  # the signal did not cut the shutdown short


def test_a_lost_worker_without_a_signal_stays_a_lost_worker(monkeypatch):
    def lost() -> None:
        raise WorkerDiedError("actor", "update_actor", 0)

    error, _, session = train(monkeypatch, Trainer(fit=lost))
    assert isinstance(error, WorkerDiedError) and exit_code_for(error) == 3 and session.shut_down


RAY_GET_INTERRUPTED = """
import os, signal, time
import ray
from rlhfctl.cli.errors import exit_code_for
from rlhfctl.ray_cluster import start_or_join_ray
from rlhfctl.run_signals import stop_on_signals

@ray.remote
def signal_the_driver(pid):
    time.sleep(1.0)  # the driver waits in ray.get by now
    os.kill(pid, signal.SIGTERM)
    time.sleep(30)  # longer than Ray's signal-check interval (1 s): the handler runs inside ray.get

session = start_or_join_ray(num_cpus=1)
try:
    with stop_on_signals():
        ray.get(signal_the_driver.remote(os.getpid()), timeout=60)
except BaseException as error:
    print("outcome", type(error).__name__, exit_code_for(error), str(error), flush=True)
finally:
    session.shutdown()
"""


@pytest.mark.slow
def test_a_sigterm_that_reaches_the_driver_inside_ray_get_exits_143(ray_tmpdir):  # noqa: F811 - the fixture
    env = {**os.environ, "RAY_TMPDIR": ray_tmpdir, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-c", RAY_GET_INTERRUPTED], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)
    outcome = [line for line in done.stdout.splitlines() if line.startswith("outcome")]
    assert outcome == ["outcome RunSignalled 143 stopped by SIGTERM"], done.stdout + done.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_inside_a_safe_point_waits_for_its_end_ctrl_c_included(signum):
    """The trainer logs a step and counts it done inside one: a Ctrl-C between the two had saved the step before."""
    done = []
    with pytest.raises(KeyboardInterrupt) as raised, sigint_not_ignored(), stop_on_signals():
        with safe_point_pending():
            os.kill(os.getpid(), signum)
            time.sleep(0.2)  # the handler has run by now, and deferred the stop
            done.append("step logged")
            done.append("step done")
    assert done == ["step logged", "step done"] and exit_code_for(raised.value) == 128 + signum
    assert isinstance(raised.value, RunSignalled) == (signum != signal.SIGINT)  # Ctrl-C stays Python's own
