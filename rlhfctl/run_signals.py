"""SIGTERM and SIGUSR1 stop a run the way Ctrl-C does: the loop unwinds, saves, and the workers stop.

Schedulers stop jobs with SIGTERM (Kubernetes, SLURM at the end), and SLURM can send SIGUSR1 ahead of
its time limit. Ray's core worker installs its own SIGTERM handler at ``ray.init`` (it dumps a C++
stack and kills the driver), so :func:`stop_on_signals` is entered after Ray is up and replaces it.
The first signal raises :class:`RunSignalled` (a ``KeyboardInterrupt``, so every Ctrl-C path applies);
later ones are ignored while the run saves and shuts down. Inside :func:`safe_point_pending` blocks
(a checkpoint being written) the stop waits until the block ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["STOP_SIGNALS", "RunSignalled", "exit_code_for_signal", "safe_point_pending", "stop_on_signals"]

#: The signals that stop a run, besides SIGINT (Ctrl-C), which Python already turns into KeyboardInterrupt.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)


def exit_code_for_signal(signum: int) -> int:
    """The shell's convention, 128 + the signal number: 143 for SIGTERM, 138 for SIGUSR1 (on Linux)."""
    return 128 + int(signum)


class RunSignalled(KeyboardInterrupt):
    """The run was asked to stop by a signal; ``exit_code`` is 128 + its number."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.exit_code = exit_code_for_signal(signum)
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class _StopState:
    """What the handler knows: whether a stop was raised, and whether a critical block defers it."""

    def __init__(self) -> None:
        self.raised = False
        self.deferred: int | None = None
        self.critical_depth = 0


_state = _StopState()


def _handle(signum: int, frame: Any) -> None:
    if _state.raised:
        return  # already stopping: let the save and the shutdown finish
    if _state.critical_depth:
        _state.deferred = signum
        return
    _state.raised = True
    raise RunSignalled(signum)


@contextlib.contextmanager
def safe_point_pending() -> Iterator[None]:
    """A block a stop must not cut (writing a checkpoint); a signal that arrives inside is raised at its end."""
    _state.critical_depth += 1
    try:
        yield
    finally:
        _state.critical_depth -= 1
        pending, _state.deferred = _state.deferred, None
        if pending is not None and not _state.critical_depth and not _state.raised:
            _state.raised = True
            raise RunSignalled(pending)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGUSR1 into :class:`RunSignalled` in the main thread while the block runs."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread (library use in a thread)
        return
    previous = {signum: signal.signal(signum, _handle) for signum in STOP_SIGNALS}
    _state.raised, _state.deferred = False, None
    try:
        yield
    finally:
        for signum, handler in previous.items():
            # A handler installed from C (Ray's) reads back as None and cannot be reinstalled from Python.
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
