"""Live progress of each rank inside a call: tokens generated, micro-batches done, rows scored.

A group call's events reach the driver only when the call is collected, so a long generate shows
nothing until it ends. Worker code calls :func:`report` from its inner loops (``done`` of ``total``
``unit``). The call costs a clock read until a quarter second has passed since the rank's last report;
then one fire-and-forget message goes to the run's :class:`ProgressBoard` (a Ray actor with no CPU
reserved, or an in-process board on the local backend). A call reports nothing in its first quarter
second: a shorter call's bar would come and go between two polls, and on a small machine the messages
of many short calls cost the step real time (the tiny quickstart's calls take tens of milliseconds). The driver's :class:`ProgressWatcher` polls
the board a few times a second and hands the latest report of every rank to an observer (the
reporter), which draws a bar per rank or names a rank that straggles.

:class:`rlhfctl.single_controller.host.WorkerHost` opens :func:`calling` around every method, so a
report knows its role, method, rank and node without the worker passing them.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Callable

__all__ = ["BOARD_NAME", "QUIET_START_S", "REPORT_INTERVAL_S", "STRAGGLER_RATIO", "ProgressBoard", "ProgressWatcher", "RankProgress",
           "call_reports", "calling", "report", "start_board", "stragglers", "watch_rank_progress"]

#: Least seconds between two reports of one rank inside a call (the last report of a call always goes).
REPORT_INTERVAL_S = 0.25
#: Seconds a call runs before its rank reports at all (``RLHFCTL_PROGRESS_QUIET_S``; the tests set 0 so
#: that short calls report too). Read when the module is imported, so it is set before Ray starts workers.
QUIET_START_S = float(os.environ.get("RLHFCTL_PROGRESS_QUIET_S", REPORT_INTERVAL_S))
#: A rank straggles when its time in a call exceeds this many times the median of the other ranks'.
STRAGGLER_RATIO = 1.5
#: The Ray actor name of a run's board (in the run's namespace), found by the workers on first report.
BOARD_NAME = "rlhfctl_progress_board"
_LOOKUP_RETRY_S = 5.0


@dataclass(frozen=True)
class RankProgress:
    """The latest report of one rank in one call."""

    role: str
    method: str
    rank: int
    node: str
    started: float
    updated: float
    done: int = 0
    total: int = 0
    unit: str = ""
    finished: bool = False

    @property
    def key(self) -> tuple[str, int, str]:
        return self.role, self.rank, self.method

    def seconds(self, now: float) -> float:
        """Time in the call: until it finished, else until ``now``."""
        return (self.updated if self.finished else now) - self.started


class ProgressBoard:
    """The latest report per (role, rank, method); a Ray actor in the cluster, a plain object on the local backend."""

    def __init__(self) -> None:
        self.latest: dict[tuple[str, int, str], RankProgress] = {}

    def put(self, progress: RankProgress) -> None:
        """Keep ``progress`` unless a later call of the same rank reported already."""
        current = self.latest.get(progress.key)
        if current is None or current.started <= progress.started:
            self.latest[progress.key] = progress

    def snapshot(self) -> list[RankProgress]:
        """Every rank's latest report."""
        return list(self.latest.values())


class _CallContext:
    """What :func:`report` knows about the call running on this rank; entered around the call by :func:`calling`.

    WorkerHost opens one around every method, so it costs two clock reads: the report itself is built
    on the first send (most calls never send one).
    """

    __slots__ = ("role", "method", "rank", "started", "opened", "last_sent", "sink", "progress", "previous")

    def __init__(self, role: str, method: str, rank: int) -> None:
        self.role, self.method, self.rank = role, method, rank
        self.started = time.time()
        self.opened = time.monotonic()
        self.last_sent = 0.0
        self.sink: Callable[[RankProgress], None] | None = None  # set by the first send
        self.progress: RankProgress | None = None
        self.previous: _CallContext | None = None

    def __enter__(self) -> None:
        self.previous = getattr(_local, "call", None)
        _local.call = self

    def __exit__(self, *exc: object) -> None:
        _local.call = self.previous
        if self.sink is not None and self.progress is not None:
            _send(self.sink, replace(self.progress, updated=time.time(), finished=True))


_local = threading.local()
_sink_state: dict[str, Any] = {"sink": None, "looked_up": 0.0, "local_board": None}


def _node() -> str:
    from rlhfctl.single_controller.worker import node_ip_address  # the worker module pulls torch: off the CLI's fast path

    node = _sink_state.get("node")
    if node is None:
        node = _sink_state["node"] = node_ip_address()
    return node


def _find_sink() -> Callable[[RankProgress], None] | None:
    """The in-process board (local backend), else the run's Ray board; looked up again after a while if absent."""
    board = _sink_state["local_board"]
    if board is not None:
        return board.put
    if _sink_state["sink"] is not None:
        return _sink_state["sink"]
    now = time.monotonic()
    if now - _sink_state["looked_up"] < _LOOKUP_RETRY_S:
        return None
    _sink_state["looked_up"] = now
    try:
        import ray  # ray: only under the ray backend, off the CLI's fast path

        if not ray.is_initialized():
            return None
        handle = ray.get_actor(BOARD_NAME)
    except Exception:  # noqa: BLE001 - no board (library use, tests): progress is not shown
        return None
    _sink_state["sink"] = handle.put.remote
    return _sink_state["sink"]


def calling(role: str, method: str, rank: int) -> _CallContext:
    """Mark ``role.method`` running on ``rank`` in this thread (``with calling(...):``); a call that reported ends
    with a finished report."""
    return _CallContext(role, method, rank)


def report(done: int, total: int, unit: str) -> None:
    """This rank has done ``done`` of ``total`` ``unit`` in its current call (throttled; cheap to call often)."""
    context: _CallContext | None = getattr(_local, "call", None)
    if context is None:
        return
    now = time.monotonic()
    if now - context.opened < QUIET_START_S:
        return
    if now - context.last_sent < REPORT_INTERVAL_S and done < total:
        return
    context.last_sent = now
    sink = _find_sink()
    if sink is None:
        return
    context.sink = sink
    context.progress = RankProgress(context.role, context.method, context.rank, _node(), context.started, time.time(),
                                    int(done), int(total), unit)
    _send(sink, context.progress)


def _send(sink: Callable[[RankProgress], None], progress: RankProgress) -> None:
    """Hand a report to the board; progress never fails a call (a board gone with its Ray session is looked up again)."""
    try:
        sink(progress)
    except Exception:  # noqa: BLE001 - the display is best effort, the worker's method is not
        _sink_state["sink"] = None


def start_board(backend: str) -> tuple[Callable[[], list[RankProgress]], Callable[[], None]]:
    """The run's board: returns (a snapshot function, a function that detaches from it).

    On Ray it is one named actor per job (a later run in the same Ray session, such as the next
    pipeline stage, reuses it; it goes with the job). On the local backend it lives in this process.
    """
    if backend != "ray":
        board = ProgressBoard()
        _sink_state["local_board"] = board

        def close_local() -> None:
            _sink_state["local_board"] = None

        return board.snapshot, close_local
    import ray  # ray: only under the ray backend

    handle = _session_board(ray)

    def snapshot() -> list[RankProgress]:
        return ray.get(handle.snapshot.remote(), timeout=5)

    return snapshot, lambda: None


def _session_board(ray: Any) -> Any:
    """This Ray session's board, created once: Ray stops an actor when its creator drops the handle it got
    at creation, so the driver keeps that handle, and a later run in the session (the next pipeline
    stage) reuses it rather than asking for the name again."""
    handle = _sink_state.get("driver_board")
    if handle is not None:
        try:
            ray.get(handle.snapshot.remote(), timeout=10)
            return handle
        except Exception:  # noqa: BLE001 - a board of an earlier Ray session: make a new one
            pass
    handle = ray.remote(num_cpus=0)(ProgressBoard).options(name=BOARD_NAME, get_if_exists=True).remote()
    ray.get(handle.snapshot.remote(), timeout=60)  # registered under its name before any rank looks it up
    _sink_state["driver_board"] = handle
    return handle


def stragglers(event: Any, reports: list[RankProgress], now: float,
               ratio: float = STRAGGLER_RATIO) -> list[tuple[RankProgress, float]]:
    """Ranks of the call ``event`` (a DispatchEvent still in flight) that straggle, each with the others' median.

    A rank straggles when every other rank of the call has finished and its time in the call exceeds
    ``ratio`` times the median of theirs. Only ranks that report progress are seen.
    """
    ranks = len(set(event.ranks or []))
    mine = call_reports(event, reports)
    finished = [p.seconds(now) for p in mine if p.finished]
    running = [p for p in mine if not p.finished]
    if ranks < 2 or len(finished) != ranks - 1 or len(running) != 1:
        return []
    median = statistics.median(finished)
    return [(running[0], median)] if running[0].seconds(now) > ratio * median else []


def call_reports(event: Any, reports: list[RankProgress]) -> list[RankProgress]:
    """The reports of ``event``'s ranks in this call (not an earlier call's; 1 s allowed for clock skew), by rank."""
    ranks = set(event.ranks or [])
    mine = [p for p in reports if p.role == event.role and p.method == event.method and p.rank in ranks
            and p.started >= event.started - 1.0]
    return sorted(mine, key=lambda p: p.rank)


@contextlib.contextmanager
def watch_rank_progress(backend: str, observer: Callable[[list[RankProgress]], None] | None) -> Iterator[None]:
    """Create the run's board and poll it into ``observer`` while the block runs (nothing when it is None)."""
    if observer is None:
        yield
        return
    snapshot, close = start_board(backend)
    watcher = ProgressWatcher(snapshot, observer).start()
    try:
        yield
    finally:
        watcher.stop()
        close()


class ProgressWatcher:
    """A driver thread that polls the board every ``interval`` seconds and passes the reports to ``observer``."""

    def __init__(self, snapshot: Callable[[], list[RankProgress]], observer: Callable[[list[RankProgress]], None],
                 interval: float = REPORT_INTERVAL_S) -> None:
        self.snapshot, self.observer, self.interval = snapshot, observer, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlhfctl-progress", daemon=True)

    def start(self) -> "ProgressWatcher":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                reports = self.snapshot()
            except Exception:  # noqa: BLE001 - the board is gone (shutdown) or busy: skip this poll
                continue
            self.observer(reports)

    def stop(self) -> None:
        """Stop polling (waits for the current poll), then poll once more: the last calls' finished reports,
        sent as those calls returned, are shown even when the run ended between two polls."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        try:
            reports = self.snapshot()
        except Exception:  # noqa: BLE001 - the board is gone (shutdown): nothing more to show
            return
        self.observer(reports)
