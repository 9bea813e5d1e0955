"""Futures of group calls, and the references that let one group's output feed another group's ranks.

A :class:`GroupFuture` is what a non-blocking group call returns. ``future.get()`` collects the result
on the driver. Passed into another group call, it is not fetched by the driver: each rank receives a
:class:`ShardRef` naming the object-store references it needs, and resolves it inside the worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from rlhfctl.single_controller.rows import RowLayout, concat_rows, take_rows

if TYPE_CHECKING:
    from rlhfctl.single_controller.worker_group import WorkerGroup

WORKER_FETCH_TIMEOUT_S = float(os.environ.get("RLHFCTL_WORKER_FETCH_TIMEOUT_S", "3600"))


@dataclass
class ShardRef:
    """What a rank receives in place of a future: references to resolve inside the worker.

    ``parts`` is a list of (object ref, row positions or None for all rows); with ``collect`` set the
    fetched values are instead joined by ``collect(outputs)`` (a whole, unsharded result).
    """

    parts: list[tuple[Any, np.ndarray | None]]
    collect: Callable[[list], Any] | None = None
    expected_rows: list[int] | None = None
    source: str = ""

    def resolve(self) -> Any:
        """Fetch the referenced values (zero-copy where possible) and assemble this rank's argument."""
        import ray  # ray: only under the ray backend, off the CLI's fast path

        values = ray.get([ref for ref, _ in self.parts], timeout=WORKER_FETCH_TIMEOUT_S)
        if self.collect is not None:
            return self.collect(values)
        if self.expected_rows is not None:
            for value, expected in zip(values, self.expected_rows):
                if len(value) != expected:
                    raise ValueError(
                        f"the future from {self.source} returned {len(value)} rows where {expected} were expected: "
                        "a method that changes the number of rows can only feed a group of the same world size; "
                        "call .get() on the future and pass the result instead"
                    )
        pieces = [value if positions is None else take_rows(value, positions) for value, (_, positions) in zip(values, self.parts)]
        return pieces[0] if len(pieces) == 1 else concat_rows(pieces)


@dataclass
class ShardUnion:
    """What a rank receives for a :class:`PendingUnion`: its rows of the batch, and refs to the
    same rows of the columns other groups computed; joined inside the worker."""

    local: Any
    refs: list[ShardRef]

    def resolve(self) -> Any:
        """This rank's shard with the pending columns joined in."""
        joined = self.local
        for ref in self.refs:
            joined = joined.union(ref.resolve())
        return joined


def materialize(value: Any) -> Any:
    """Inside a worker: turn a ShardRef, ShardUnion or Ray ObjectRef argument into its value; others pass through."""
    if isinstance(value, (ShardRef, ShardUnion)):
        return value.resolve()
    if type(value).__name__ == "ObjectRef":
        import ray  # ray: only under the ray backend, off the CLI's fast path

        return ray.get(value, timeout=WORKER_FETCH_TIMEOUT_S)
    return value


@dataclass
class GroupFuture:
    """The pending result of a non-blocking group call."""

    group: "WorkerGroup"
    method: str
    handles: list[Any]
    collect: Callable[[list], Any]
    ranks: list[int]
    layout: RowLayout | None = None
    plain_collect: Callable[[list], Any] | None = None
    """The collect function without driver-side reporting: what a rank runs when it takes the whole result."""
    _result: Any = field(default=None, repr=False)
    _done: bool = field(default=False, repr=False)

    def get(self, timeout: float | None = None) -> Any:
        """Wait (bounded by the group's call timeout unless given) and return the collected result."""
        if not self._done:
            outputs = self.group._wait(self.method, self.handles, self.ranks, timeout)
            self._result = self.collect(outputs)
            self._done = True
            self.handles = []
        return self._result

    def done(self) -> bool:
        """True once every rank has finished (does not raise for failed ranks)."""
        return self._done or self.group._ready(self.handles)

    @property
    def describe(self) -> str:
        return f"{self.group.role}.{self.method}"

    def refs(self) -> Sequence[Any]:
        """The per-rank handles (Ray ObjectRefs on the Ray backend) before the result is fetched."""
        return list(self.handles)


@dataclass
class PendingUnion:
    """A batch joined with the results of group calls still in flight (see :func:`union_pending`)."""

    batch: Any
    futures: tuple[GroupFuture, ...]

    def __len__(self) -> int:
        return len(self.batch)

    def get(self) -> Any:
        """The joined batch, fetched on the driver (the fallback when the ranks cannot join it)."""
        joined = self.batch
        for future in self.futures:
            joined = joined.union(future.get())
        return joined


def union_pending(batch: Any, *futures: GroupFuture) -> Any:
    """``batch.union(future.get())`` for each future, done on the ranks of the call it is passed to.

    Passed to an ALL_TO_ALL call on a group with the futures' world size, each rank joins its own rows
    with the same rows of the futures' outputs, so the call is sent before those results exist and
    they never pass through the driver. Anywhere else the driver fetches and joins them first.
    The batch's rows must be the futures' collected rows, in order (as for ``DataProto.union``).
    With no futures it returns ``batch`` itself.
    """
    return PendingUnion(batch, futures) if futures else batch
