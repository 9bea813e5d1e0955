"""Errors raised by worker groups: each names the role, method and rank involved."""

from __future__ import annotations

from rlhfctl.errors import UserError, WorkerLost


class WorkerGroupError(RuntimeError):
    """Base class for failures of a group call."""


class WorkerMethodError(WorkerGroupError):
    """A worker method raised; carries the worker's own traceback, and ``user_error`` when the cause was a UserError.

    The backends set ``user_error`` from the type of the worker's exception (``isinstance(cause, UserError)``). Left
    None, for an error built by hand from a ``detail`` text, it is read from the detail's leading class name.
    """

    def __init__(self, role: str, worker_class: str, method: str, rank: int, detail: str, worker_traceback: str = "",
                 user_error: bool | None = None):
        self.role, self.worker_class, self.method, self.rank = role, worker_class, method, rank
        self.detail = detail
        self.worker_traceback = worker_traceback
        self.user_error = _names_user_error(detail) if user_error is None else bool(user_error)
        message = f"{role}.{method} failed on rank {rank} ({worker_class}): {detail}"
        if worker_traceback:
            message += f"\n--- traceback from {role} rank {rank} ---\n{worker_traceback.rstrip()}"
        super().__init__(message)


class WorkerMethodLost(WorkerMethodError, WorkerLost):
    """A worker method raised a ``WorkerLost`` of its own (a service the rank depends on stayed down): exit 3, shown
    as the one line that names role, method, rank and cause; the worker's traceback stays in ``worker_traceback``."""

    def __init__(self, role: str, worker_class: str, method: str, rank: int, detail: str, worker_traceback: str = "",
                 cause: str = ""):
        super().__init__(role, worker_class, method, rank, detail, worker_traceback, user_error=False)
        self.cause = cause or detail

    def __str__(self) -> str:
        return f"{self.role}.{self.method} failed on rank {self.rank} ({self.worker_class}): {self.detail}"


def method_error(role: str, worker_class: str, method: str, rank: int, cause: BaseException, detail: str,
                 worker_traceback: str = "") -> WorkerMethodError:
    """The driver's error for a worker method that raised ``cause``: exit 2 for a UserError, 3 for a WorkerLost
    (:class:`WorkerMethodLost`), else an internal error with the worker's traceback."""
    if isinstance(cause, WorkerLost):
        return WorkerMethodLost(role, worker_class, method, rank, detail, worker_traceback,
                                str(getattr(cause, "cause", "") or ""))
    return WorkerMethodError(role, worker_class, method, rank, detail, worker_traceback,
                             user_error=isinstance(cause, UserError))


class WorkerDiedError(WorkerGroupError, WorkerLost):
    """A worker process exited (crash, OOM kill, kill -9) while the driver waited on it; ``cause`` says so briefly."""

    def __init__(self, role: str, method: str, rank: int, detail: str = ""):
        self.role, self.method, self.rank = role, method, rank
        self.detail = detail
        self.cause = "process died"
        text = f"worker process for {role} rank {rank} died during {role}.{method}"
        super().__init__(text + (f": {detail}" if detail else ""))


class WorkerTimeoutError(WorkerGroupError, WorkerLost):
    """A group call did not finish within its time limit; ``rank`` is the first rank still running."""

    def __init__(self, role: str, method: str, timeout_s: float, pending_ranks: list[int]):
        self.role, self.method, self.timeout_s, self.pending_ranks = role, method, timeout_s, pending_ranks
        self.rank = pending_ranks[0] if pending_ranks else None
        self.cause = f"no answer within trainer.call_timeout_s={timeout_s:g} s"
        super().__init__(
            f"{role}.{method} did not finish within {timeout_s:g} s; ranks still running: {pending_ranks}. "
            "Raise trainer.call_timeout_s if the work is genuinely this slow."
        )


class ResourcePoolError(WorkerGroupError, UserError):
    """A resource pool cannot be placed on the cluster (a user error: the pools ask for more than it has)."""


def _names_user_error(detail: str) -> bool:
    """True when ``detail`` starts with ``Name:`` and Name is a UserError class (for errors built by hand)."""
    name = str(detail).partition(":")[0].strip()
    pending, seen = [UserError], set()
    while pending:
        cls = pending.pop()
        if cls.__name__ == name:
            return True
        seen.add(cls)
        pending += [sub for sub in cls.__subclasses__() if sub not in seen]
    return False
