"""The agent program: loaded from the recipe, and run once per trajectory in a thread of its own.

A program is an ``async`` function, ``module:function`` or ``path/to/file.py:function``::

    async def program(*, base_url: str, api_key: str, model: str, sample: dict) -> float | None: ...

It talks to ``base_url`` (an OpenAI-compatible ``.../v1``) with ``api_key`` as its bearer token, and returns a
float reward, or None to leave the scoring to the recipe's reward function.

Each run has a thread to itself, with that thread's event loop, so a program that blocks (a synchronous HTTP
client, a blocking tool) blocks only itself, never the endpoint or the other programs. The threads are the
process's (daemon threads, idle between runs, reused by later rollout calls: no thread start per run); the tasks a
run leaves behind are cancelled when it ends. Create clients inside the program: a client cached at module level is
bound to another thread's loop. A run that raises, returns something other than a number or None, or passes its
timeout is a failed run (:class:`ProgramOutcome`); at the timeout its task is cancelled, and a run that cannot be
cancelled (blocked in a synchronous call) keeps its thread until it returns, counted in :func:`abandoned_threads`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import numbers
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.importing import ensure_cwd_importable, import_python_file

__all__ = ["PROGRAM_KEY", "Program", "ProgramOutcome", "abandoned_threads", "load_program", "run_program"]

PROGRAM_KEY = "rollout.agent_server.program"
ARGUMENTS = ("base_url", "api_key", "model", "sample")

Program = Callable[..., Awaitable[Any]]

_STOP_GRACE_S = 2.0


def load_program(ref: str, key: str = PROGRAM_KEY) -> Program:
    """The program ``ref`` names, imported and checked: an async function taking ``base_url``, ``api_key``, ``model``
    and ``sample`` by keyword; a :class:`RecipeError` naming ``key`` otherwise."""
    target, colon, name = str(ref).rpartition(":")
    if not colon or not target or not name.isidentifier():
        raise RecipeError(f"{key}: {ref!r} must be 'package.module:function' or 'path/to/file.py:function'", key, "invalid")
    try:
        ensure_cwd_importable()
        module = import_python_file(Path(target).expanduser()) if target.endswith(".py") else importlib.import_module(target)
    except (Exception, SystemExit) as error:  # user code may fail in any way at import time
        detail = str(error).splitlines()[0] if str(error) else ""
        raise RecipeError(f"{key}: cannot import {ref!r}: {type(error).__name__}: {detail}", key, "import") from None
    program = getattr(module, name, None)
    if program is None:
        raise RecipeError(f"{key}: cannot import {ref!r}: {target!r} has no attribute {name!r}", key, "import")
    if not inspect.iscoroutinefunction(program):
        raise RecipeError(f"{key}: {ref!r} is not an async function (write 'async def {name}(*, base_url, api_key, model, sample)')", key, "invalid")
    problem = _signature_problem(program)
    if problem:
        raise RecipeError(f"{key}: {ref!r} {problem}", key, "invalid")
    return program


def _signature_problem(program: Program) -> str | None:
    try:
        params = inspect.signature(program).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(param.kind is param.VAR_KEYWORD for param in params):
        return None
    by_keyword = {param.name for param in params if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)}
    missing = [name for name in ARGUMENTS if name not in by_keyword]
    required = [param.name for param in params if param.default is param.empty and param.name not in ARGUMENTS
                and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)]
    if missing:
        return f"does not take {', '.join(missing)} by keyword; it is called as program(base_url=..., api_key=..., model=..., sample={{...}})"
    if required:
        return f"needs {', '.join(required)}, which the endpoint does not pass (it passes {', '.join(ARGUMENTS)})"
    return None


@dataclass(frozen=True)
class ProgramOutcome:
    """How one program run ended: its reward (None: the reward function scores), or why it failed."""

    reward: float | None
    error: str | None
    """Why the run failed (raised, timed out, returned a non-number); None when it did not."""
    timed_out: bool
    seconds: float

    @property
    def failed(self) -> bool:
        """The run raised, timed out or returned something other than a number or None."""
        return self.error is not None


class _ProgramThread(threading.Thread):
    """A daemon thread running an event loop of its own forever; it runs one program at a time."""

    def __init__(self) -> None:
        super().__init__(name="agent-program", daemon=True)
        self.loop = asyncio.new_event_loop()
        self.given_up = False
        """The caller stopped waiting for the current run (its timeout passed)."""

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()


class _ProgramThreads:
    """This process's program threads: an idle one runs the next program, a new one starts when none is idle.

    They live as long as the process (a rollout worker's lifetime), so a rollout call pays no thread start once the
    first has; a thread whose program blocks past its timeout stays out of the pool until the program returns.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_ProgramThread] = []
        self._busy: set[_ProgramThread] = set()

    def take(self) -> _ProgramThread:
        """An idle thread, or a new one."""
        with self._lock:
            while self._idle and not self._idle[-1].is_alive():
                self._idle.pop()
            thread = self._idle.pop() if self._idle else None
            if thread is None:
                thread = _ProgramThread()
                thread.start()
            thread.given_up = False
            self._busy.add(thread)
            return thread

    def give_back(self, thread: _ProgramThread) -> None:
        """The thread's run is over (called from that thread): it is idle again."""
        with self._lock:
            self._busy.discard(thread)
            self._idle.append(thread)

    def abandoned(self) -> int:
        """Threads whose run was given up and still runs (blocked in a call that cannot be cancelled)."""
        with self._lock:
            return sum(1 for thread in self._busy if thread.given_up)


_THREADS = _ProgramThreads()


async def _run_alone(program: Program, arguments: Mapping[str, Any]) -> Any:
    """On a program thread: the program, then whatever it left running cancelled (the loop serves the next run)."""
    try:
        return await program(**arguments)
    except (SystemExit, KeyboardInterrupt) as error:  # would stop the thread's loop: a failure of this run only
        raise RuntimeError(f"{type(error).__name__}: {error}") from None
    finally:
        here = asyncio.current_task()
        leftovers = [task for task in asyncio.all_tasks() if task is not here and not task.done()]
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.wait(leftovers, timeout=_STOP_GRACE_S)


def _start(thread: _ProgramThread, program: Program, arguments: Mapping[str, Any], result: Future) -> Callable[[], None]:
    """Schedule the run on ``thread``'s loop; ``result`` gets its end, and the thread is idle again only once the run's
    task is done (a cancelled run that does not stop keeps its thread). Returns what cancels the run (thread-safe)."""
    box: dict[str, asyncio.Task] = {}

    def finished(task: asyncio.Task) -> None:
        _THREADS.give_back(thread)
        if result.done():
            return
        if task.cancelled():
            result.cancel()
        elif task.exception() is not None:
            result.set_exception(task.exception())  # type: ignore[arg-type]
        else:
            result.set_result(task.result())

    def start() -> None:
        box["task"] = thread.loop.create_task(_run_alone(program, arguments))
        box["task"].add_done_callback(finished)

    thread.loop.call_soon_threadsafe(start)
    return lambda: thread.loop.call_soon_threadsafe(lambda: box["task"].cancel())  # after start: the loop runs FIFO


async def run_program(program: Program, arguments: Mapping[str, Any], timeout_s: float) -> ProgramOutcome:
    """Run ``program(**arguments)`` once on a program thread, at most ``timeout_s`` seconds; never raises for the
    program's own failures (they are the outcome's ``error``)."""
    thread = _THREADS.take()
    start = time.perf_counter()
    result: Future = Future()
    try:
        cancel = _start(thread, program, arguments, result)
    except BaseException:
        _THREADS.give_back(thread)
        raise
    done = asyncio.wrap_future(result)
    try:
        value = await asyncio.wait_for(asyncio.shield(done), timeout_s)
    except asyncio.TimeoutError:
        thread.given_up = True
        cancel()  # the program's task is cancelled in its loop
        try:  # its end, whatever it is, is waited for no longer than the grace
            await asyncio.wait_for(asyncio.shield(done), _STOP_GRACE_S)
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # type: ignore[union-attr] - we are cancelled, not the program
                raise
        except Exception:  # noqa: BLE001 - the program's end after its timeout does not matter any more
            pass
        return ProgramOutcome(None, f"the program did not finish within {timeout_s:g} s (rollout.agent_server.trajectory_timeout_s)",
                              True, time.perf_counter() - start)
    except asyncio.CancelledError:
        cancel()
        raise
    except Exception as error:  # the program's failure fails its run only
        return ProgramOutcome(None, _describe(error), False, time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if value is None:
        return ProgramOutcome(None, None, False, seconds)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value)):
        return ProgramOutcome(float(value), None, False, seconds)
    return ProgramOutcome(None, f"the program returned {value!r}"[:200] + "; return a finite float reward, or None", False, seconds)


def _describe(error: BaseException) -> str:
    """The error with the program's innermost frame, e.g. ``ValueError: bad (program.py:12 in run)``."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}"[:500] + where


def abandoned_threads() -> int:
    """Program threads still running after their run ended (blocked past the timeout in a call that cannot be cancelled)."""
    return _THREADS.abandoned()
