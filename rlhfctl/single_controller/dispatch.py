"""Dispatch and collect: how one group call's arguments become per-rank arguments, and back.

The built-in modes follow the seed's table:

=============  ==========================================  ===================================
mode           rank i receives                             the caller receives
=============  ==========================================  ===================================
ONE_TO_ALL     the same arguments                          a list, one result per rank
ALL_TO_ALL     shard i of every batch argument; the rest   the per-rank results concatenated,
               broadcast                                   padding stripped (N rows in, N out)
ONE_TO_ONE     element i of every argument                 a list, one result per rank
=============  ==========================================  ===================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from rlhfctl.single_controller.decorator import Dispatch, DispatchMode
from rlhfctl.single_controller.futures import GroupFuture, PendingUnion, ShardRef, ShardUnion
from rlhfctl.single_controller.rows import RowLayout, concat_rows, is_batch, same_batch_type, take_rows

if TYPE_CHECKING:
    from rlhfctl.single_controller.worker_group import WorkerGroup


@dataclass
class CallPlan:
    """Per-rank arguments of one group call, and how to join the per-rank results."""

    rank_args: list[tuple]
    rank_kwargs: list[dict]
    collect: Callable[[list], Any]
    layout: RowLayout | None = None

    def rows_per_rank(self) -> list[int] | None:
        """Rows each rank receives under ALL_TO_ALL (None for other modes)."""
        if self.layout is None:
            return None
        return [self.layout.shard_size] * self.layout.world_size


@dataclass(frozen=True)
class GroupInfo:
    """What a custom collect function may read about the group when it runs inside a worker."""

    role: str
    world_size: int


def build_plan(group: "WorkerGroup", mode: DispatchMode, args: tuple, kwargs: dict) -> CallPlan:
    """Split one call's arguments for ``group`` according to ``mode``."""
    if mode is Dispatch.ONE_TO_ALL or mode.name == "ONE_TO_ALL":
        return _plan_one_to_all(group, args, kwargs)
    if mode is Dispatch.ALL_TO_ALL or mode.name == "ALL_TO_ALL":
        return _plan_all_to_all(group, args, kwargs)
    if mode is Dispatch.ONE_TO_ONE or mode.name == "ONE_TO_ONE":
        return _plan_one_to_one(group, args, kwargs)
    return _plan_custom(group, mode, args, kwargs)


# ---------------------------------------------------------------------------------- helpers
def _usable_refs(group: "WorkerGroup", value: Any) -> bool:
    """True when ``value`` is a pending future whose ranks' outputs ``group`` can fetch itself."""
    return isinstance(value, GroupFuture) and not value._done and value.group.backend == "ray" and group.backend == "ray"


def _resolve_on_driver(value: Any) -> Any:
    return value.get() if isinstance(value, (GroupFuture, PendingUnion)) else value


def _whole_value_ref(future: GroupFuture) -> ShardRef:
    """A ref that makes a rank fetch every output of ``future`` and collect it, as the driver would."""
    collect = future.plain_collect or future.collect
    return ShardRef(parts=[(ref, None) for ref in future.handles], collect=collect, source=future.describe)


def _per_rank(values: list, world_size: int) -> list:
    return [values[rank] for rank in range(world_size)]


def _transpose(group: "WorkerGroup", split_args: list[list], split_kwargs: dict[str, list]) -> tuple[list[tuple], list[dict]]:
    world_size = group.world_size
    rank_args = [tuple(arg[rank] for arg in split_args) for rank in range(world_size)]
    rank_kwargs = [{key: value[rank] for key, value in split_kwargs.items()} for rank in range(world_size)]
    return rank_args, rank_kwargs


def _collect_list(outputs: list) -> list:
    return list(outputs)


# ---------------------------------------------------------------------------------- ONE_TO_ALL
def _plan_one_to_all(group: "WorkerGroup", args: tuple, kwargs: dict) -> CallPlan:
    def broadcast(value: Any) -> Any:
        if _usable_refs(group, value):
            return _whole_value_ref(value)
        return _resolve_on_driver(value)

    shared_args = tuple(broadcast(arg) for arg in args)
    shared_kwargs = {key: broadcast(value) for key, value in kwargs.items()}
    world_size = group.world_size
    return CallPlan([shared_args] * world_size, [shared_kwargs] * world_size, _collect_list)


# ---------------------------------------------------------------------------------- ONE_TO_ONE
def _plan_one_to_one(group: "WorkerGroup", args: tuple, kwargs: dict) -> CallPlan:
    world_size = group.world_size

    def split(name: str, value: Any) -> list:
        if _usable_refs(group, value) and value.layout is None and len(value.handles) == world_size:
            return [ShardRef(parts=[(ref, None)], source=value.describe) for ref in value.handles]
        value = _resolve_on_driver(value)
        if not isinstance(value, (list, tuple)) or len(value) != world_size:
            got = f"{type(value).__name__} of length {len(value)}" if hasattr(value, "__len__") else type(value).__name__
            raise ValueError(
                f"ONE_TO_ONE argument {name} must be a list with one entry per rank ({world_size}), got {got}"
            )
        return list(value)

    split_args = [split(f"#{i}", arg) for i, arg in enumerate(args)]
    split_kwargs = {key: split(f"'{key}'", value) for key, value in kwargs.items()}
    rank_args, rank_kwargs = _transpose(group, split_args, split_kwargs)
    return CallPlan(rank_args, rank_kwargs, _collect_list)


# ---------------------------------------------------------------------------------- ALL_TO_ALL
def _future_rows(future: GroupFuture) -> int | None:
    return future.layout.num_rows if future.layout is not None else None


def _plan_all_to_all(group: "WorkerGroup", args: tuple, kwargs: dict) -> CallPlan:
    world_size = group.world_size
    named = [(f"#{i}", arg) for i, arg in enumerate(args)] + [(f"'{key}'", value) for key, value in kwargs.items()]

    # Futures whose row layout is unknown (RANK_ZERO, ONE_TO_ALL results...) are fetched on the driver,
    # and so are pending unions the ranks cannot join themselves.
    resolved: dict[str, Any] = {}
    for name, value in named:
        if isinstance(value, GroupFuture) and not (_usable_refs(group, value) and value.layout is not None):
            value = value.get()
        if isinstance(value, PendingUnion) and not _ranks_can_join(group, value):
            value = value.get()
        resolved[name] = value

    sizes = {}
    for name, value in resolved.items():
        if isinstance(value, GroupFuture):
            sizes[name] = _future_rows(value)
        elif isinstance(value, PendingUnion) or is_batch(value):
            sizes[name] = len(value)
    if not sizes:
        layout = None
    else:
        distinct = set(sizes.values())
        if len(distinct) > 1:
            listing = ", ".join(f"argument {name}: {size} rows" for name, size in sizes.items())
            raise ValueError(f"ALL_TO_ALL batch arguments disagree on the number of rows ({listing})")
        total = distinct.pop()
        if total == 0:
            raise ValueError("ALL_TO_ALL got an empty batch (0 rows); there is nothing to split across ranks")
        layout = RowLayout(num_rows=total, world_size=world_size)

    def split(value: Any) -> list:
        if isinstance(value, GroupFuture):
            return _split_future(value, layout)
        if isinstance(value, PendingUnion):
            return _split_pending_union(value, layout)
        if layout is not None and is_batch(value):
            return [take_rows(value, layout.positions(rank)) for rank in range(world_size)]
        return [value] * world_size

    split_values = {name: split(value) for name, value in resolved.items()}
    split_args = [split_values[f"#{i}"] for i in range(len(args))]
    split_kwargs = {key: split_values[f"'{key}'"] for key in kwargs}
    rank_args, rank_kwargs = _transpose(group, split_args, split_kwargs)
    return CallPlan(rank_args, rank_kwargs, _make_all_to_all_collect(layout), layout)


def _split_future(future: GroupFuture, layout: RowLayout) -> list[ShardRef]:
    """Per-rank refs into another group's outputs, resolved inside the workers."""
    source = future.layout
    if source == layout:
        # Same rows over the same number of ranks: rank i's input is exactly the source's rank i output.
        return [ShardRef(parts=[(ref, None)], source=future.describe) for ref in future.handles]
    # Different world sizes: map each of our padded rows to (source rank, row within its shard).
    # Valid when the source method returns one row per input row, which the worker checks.
    refs = []
    for rank in range(layout.world_size):
        wanted = layout.positions(rank)
        owner = wanted // source.shard_size
        parts, expected = [], []
        # One part per run of rows owned by the same source rank, so row order is kept.
        run_starts = np.flatnonzero(np.diff(owner, prepend=-1))
        for start, stop in zip(run_starts, list(run_starts[1:]) + [len(owner)]):
            source_rank = int(owner[start])
            local = wanted[start:stop] - source_rank * source.shard_size
            parts.append((future.handles[source_rank], local))
            expected.append(source.shard_size)
        refs.append(ShardRef(parts=parts, expected_rows=expected, source=future.describe))
    return refs


def _ranks_can_join(group: "WorkerGroup", pending: PendingUnion) -> bool:
    """True when rank i of ``group`` can join its rows of the batch with rank i's output of every future.

    That holds when each future ran ALL_TO_ALL over ``group``'s world size without padding, and the
    batch splits over the same ranks without padding (each rank's rows then line up; the worker checks
    the row counts).
    """
    world_size, rows = group.world_size, len(pending.batch)
    if rows == 0 or rows % world_size:
        return False
    for future in pending.futures:
        source = future.layout
        if not _usable_refs(group, future) or source is None:
            return False
        if source.world_size != world_size or source.pad or rows % source.num_rows:
            return False
    return True


def _split_pending_union(pending: PendingUnion, layout: RowLayout) -> list[ShardUnion]:
    """Each rank's rows of the batch, with refs to its own output of every pending future."""
    return [
        ShardUnion(
            local=take_rows(pending.batch, layout.positions(rank)),
            refs=[ShardRef(parts=[(future.handles[rank], None)], expected_rows=[layout.shard_size], source=future.describe)
                  for future in pending.futures],
        )
        for rank in range(layout.world_size)
    ]


def _make_all_to_all_collect(layout: RowLayout | None) -> Callable[[list], Any]:
    def collect(outputs: list) -> Any:
        if not same_batch_type(outputs):
            return list(outputs)
        joined = concat_rows(outputs)
        if layout is None or layout.pad == 0:
            return joined
        padded_total = layout.num_rows + layout.pad
        if len(joined) % padded_total:
            raise ValueError(
                f"cannot strip ALL_TO_ALL padding: the ranks returned {len(joined)} rows for {padded_total} padded "
                "input rows (a method that changes the row count must return a whole multiple of its input rows)"
            )
        per_input_row = len(joined) // padded_total
        return take_rows(joined, np.arange(layout.num_rows * per_input_row))

    return collect


# ---------------------------------------------------------------------------------- custom modes
def _plan_custom(group: "WorkerGroup", mode: DispatchMode, args: tuple, kwargs: dict) -> CallPlan:
    args = tuple(_resolve_on_driver(arg) for arg in args)
    kwargs = {key: _resolve_on_driver(value) for key, value in kwargs.items()}
    split = mode.dispatch_fn(group, *args, **kwargs)
    if not (isinstance(split, tuple) and len(split) == 2):
        raise TypeError(f"dispatch_fn of {mode.name} must return (args, kwargs), got {type(split).__name__}")
    split_args, split_kwargs = split
    world_size = group.world_size
    for name, value in [(f"#{i}", v) for i, v in enumerate(split_args)] + list(dict(split_kwargs).items()):
        if not isinstance(value, (list, tuple)) or len(value) != world_size:
            raise ValueError(
                f"dispatch_fn of {mode.name} must give every argument as a list of {world_size} entries "
                f"(one per rank); argument {name} is not"
            )
    rank_args, rank_kwargs = _transpose(group, list(split_args), dict(split_kwargs))
    info = GroupInfo(role=group.role, world_size=world_size)
    collect_fn = mode.collect_fn

    def collect(outputs: list) -> Any:
        return collect_fn(info, outputs)

    return CallPlan(rank_args, rank_kwargs, collect)
