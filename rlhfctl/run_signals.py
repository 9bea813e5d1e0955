"""SIGTERM and SIGUSR1 stop a run the way Ctrl-C does: the loop unwinds, saves, and the workers stop.

Schedulers stop jobs with SIGTERM (Kubernetes, SLURM at the end), and SLURM can send SIGUSR1 ahead of
its time limit. Ray's core worker installs its own SIGTERM handler at ``ray.init`` (it dumps a C++
stack and kills the driver), so :func:`stop_on_signals` is entered after Ray is up and replaces it.
The first signal raises :class:`RunSignalled` (a ``KeyboardInterrupt``, so every Ctrl-C path applies);
later ones are ignored while the run saves and shuts down. Inside :func:`safe_point_pending` blocks
(a checkpoint being written, a step being logged and counted done) the stop, Ctrl-C's first included,
waits until the block ends.

Inside :func:`step_in_progress` (a training step, from its first call to its metrics line) the first stop
request waits for the step to end, so the run saves that step, whole: a stop in the middle of a step
would leave workers with part of it done (an update applied, a generation's random stream taken) and no
checkpoint could say which. A second request there stops at once, without a save (the last checkpoint
is kept); inside a checkpoint write it still waits.

The first stop request (Ctrl-C included) is also remembered, because the exception it raises does not
always reach the run as itself: a handler that runs while the driver waits inside Ray (``ray.get``,
``ray.wait``) raises in Ray's signal check, and Ray replaces whatever it raised with a bare
``KeyboardInterrupt``; and a scheduler that signals every process of a job stops the workers too, so a
lost worker can surface before the driver's own handler has run. :func:`stop_cause` turns either back
into the :class:`RunSignalled` of the signal that arrived, so the message and the exit code name it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from rlhfctl.errors import WorkerLost

__all__ = ["STOP_SIGNALS", "RunSignalled", "exit_code_for_signal", "safe_point_pending", "step_in_progress",
           "stop_cause", "stop_on_signals", "stop_requested"]

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
    """What the handlers know: the first stop request, whether a stop was raised, whether a critical block defers it."""

    def __init__(self) -> None:
        self.received: int | None = None  # the first of SIGINT, SIGTERM, SIGUSR1 since stop_on_signals began
        self.raised = False
        self.deferred = False
        self.critical_depth = 0
        self.step_depth = 0
        self.forced = False  # a second request inside a step, waiting only for a checkpoint write to end
        self.step_notice: Callable[[str], None] | None = None  # told when a stop waits for the step's end


_state = _StopState()


def _signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def _waits(signum: int) -> bool:
    """Whether a stop request arriving now waits: inside a checkpoint write always, inside a step the first one."""
    if _state.critical_depth:
        _state.forced = _state.forced or (_state.deferred and bool(_state.step_depth))  # a second request in a step
        _state.deferred = True
        return True
    if _state.step_depth and not _state.deferred:
        _state.deferred = True
        if _state.step_notice is not None:
            try:
                _state.step_notice(_signal_name(signum))
            except Exception:  # noqa: BLE001 - a notice must never break the stop
                pass
        return True
    return False  # no block defers it, or a second request inside a step: stop now


def _handle(signum: int, frame: Any) -> None:
    if _state.received is None:
        _state.received = signum  # first, before anything can go wrong: stop_cause reads it
    if _state.raised:
        return  # already stopping: let the save and the shutdown finish
    if _waits(signum):
        return
    _state.raised = True
    raise RunSignalled(_state.received)


def _interrupt(signum: int, frame: Any) -> None:
    """Ctrl-C as Python has it (a KeyboardInterrupt each time), remembered as the first request if it is; the first one
    waits for the end of a :func:`safe_point_pending` block or a step, as the other stop signals do."""
    if _state.received is None:
        _state.received = signum
    if not _state.raised and _waits(signum):
        return
    _state.raised = True  # a SIGTERM that follows does not cut the save that Ctrl-C started
    signal.default_int_handler(signum, frame)


def stop_requested() -> bool:
    """Whether a stop waits for the end of the step or block in progress (the step sends nothing ahead then)."""
    return _state.deferred or _state.raised


def _raise_deferred() -> None:
    """Raise the stop that waited, once no block defers it any longer."""
    if _state.deferred and not _state.critical_depth and (_state.forced or not _state.step_depth) and not _state.raised:
        _state.deferred = _state.forced = False
        _state.raised = True
        # Ctrl-C goes on as Python's own KeyboardInterrupt, the others as the RunSignalled naming them.
        raise KeyboardInterrupt() if _state.received == signal.SIGINT else RunSignalled(_state.received)


def stop_cause(error: BaseException) -> BaseException:
    """``error``, or the :class:`RunSignalled` of the stop signal that arrived first, when ``error`` is its doing.

    A bare ``KeyboardInterrupt`` (the handler ran inside a Ray wait, which replaced its exception) and a
    lost worker (the signal reached the workers as well) are; Ctrl-C stays a ``KeyboardInterrupt`` (130).
    """
    signum = _state.received
    if signum is None or signum == signal.SIGINT or isinstance(error, RunSignalled):
        return error
    if isinstance(error, (KeyboardInterrupt, WorkerLost)):
        stop = RunSignalled(signum)
        stop.__cause__ = error
        return stop
    return error


@contextlib.contextmanager
def safe_point_pending() -> Iterator[None]:
    """A block a stop must not cut (writing a checkpoint); a signal that arrives inside is raised at its end."""
    _state.critical_depth += 1
    try:
        yield
    finally:
        _state.critical_depth -= 1
        _raise_deferred()  # not inside an outer block or a step: those raise it at their own end


@contextlib.contextmanager
def step_in_progress(notice: Callable[[str], None] | None = None) -> Iterator[None]:
    """A training step: the first stop request waits for its end (``notice(signal name)`` says so), a second
    one stops at once; the waiting stop is raised when the block ends."""
    _state.step_depth += 1
    previous, _state.step_notice = _state.step_notice, notice
    try:
        yield
    finally:
        _state.step_depth -= 1
        _state.step_notice = previous
        _raise_deferred()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGUSR1 into :class:`RunSignalled` in the main thread while the block runs.

    What leaves the block names the first stop signal that arrived (:func:`stop_cause`), whatever the
    run saw first.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread (library use in a thread)
        return
    _state.received, _state.raised, _state.deferred, _state.forced = None, False, False, False
    previous = {signum: signal.signal(signum, _handle) for signum in STOP_SIGNALS}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored (cmd &)
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    except (KeyboardInterrupt, WorkerLost) as error:
        stop = stop_cause(error)
        if stop is error:
            raise
        raise stop from error
    finally:
        for signum, handler in previous.items():
            # A handler installed from C (Ray's) reads back as None and cannot be reinstalled from Python.
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
