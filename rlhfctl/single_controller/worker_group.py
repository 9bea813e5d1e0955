"""WorkerGroup: one call on the driver becomes a call on every rank, with data split and joined.

At construction the group reads the ``@register`` spec of each method of its worker class and binds a
group method of the same name (the seed's ``_bind_worker_method``). A call builds a dispatch plan,
launches the ranks through the backend, and collects (or returns a future when non-blocking).

One calling style: ``group.update_actor(batch)`` runs as the method's spec says (blocking by default),
and ``group.update_actor.submit(batch)`` returns a :class:`GroupFuture` at once.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller.decorator import DispatchSpec, Execute, registered_methods
from rlhfctl.single_controller.dispatch import CallPlan, build_plan
from rlhfctl.single_controller.futures import GroupFuture, ShardUnion

def payload_bytes(value: Any) -> int:
    """Bytes of tensor data in one argument (DataProto, tensor or array); 0 for anything else."""
    if isinstance(value, DataProto):
        return value.nbytes()
    if isinstance(value, ShardUnion):
        return payload_bytes(value.local)
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.numel()
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value.nbytes
    return 0


def _first_output(outputs: list) -> Any:
    """Execute.RANK_ZERO: the caller gets rank 0's result itself."""
    return outputs[0]


DEFAULT_CALL_TIMEOUT_S = float(os.environ.get("RLHFCTL_CALL_TIMEOUT_S", "1800"))


@dataclass
class DispatchEvent:
    """One group call as observers (progress display, trace) see it."""

    role: str
    method: str
    dispatch_mode: str
    execute_mode: str
    ranks: list[int]
    rows_per_rank: list[int] | None
    started: float
    finished: float | None = None
    dispatch_s: float = 0.0
    collect_s: float = 0.0
    bytes_sent: int = 0


class DispatchObserver(Protocol):
    """Receives group-call events; used by the progress view and the dispatch trace."""

    def call_started(self, event: DispatchEvent) -> None: ...

    def call_finished(self, event: DispatchEvent) -> None: ...


class GroupMethod:
    """A registered worker method bound to a group: call it to run it as its spec says, ``.submit`` for a future."""

    def __init__(self, group: "WorkerGroup", name: str, spec: DispatchSpec) -> None:
        self._group = group
        self.dispatch_spec = spec
        self.__name__ = name
        self.__qualname__ = f"{type(group).__name__}[{group.role}].{name}"
        self.__doc__ = getattr(group.worker_cls, name).__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._group.call(self.__name__, *args, **kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> GroupFuture:
        """Start the call on every rank and return its future at once, whatever the spec's ``blocking`` says.

        The driver uses this to keep independent calls on different groups in flight together.
        """
        return self._group.submit(self.__name__, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<group method {self.__qualname__}>"


class WorkerGroup:
    """A group of ranks running one worker class; registered methods become group methods."""

    backend = "base"
    _GROUP_ATTRIBUTES = frozenset(
        {"role", "world_size", "call", "submit", "shutdown", "method_specs", "observers", "worker_cls", "backend"}
    )

    def __init__(self, role: str, worker_cls: type, world_size: int, call_timeout_s: float | None = None) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self.role = role
        self.worker_cls = worker_cls
        self._world_size = world_size
        self.call_timeout_s = call_timeout_s or DEFAULT_CALL_TIMEOUT_S
        self.observers: list[DispatchObserver] = []
        self.method_specs: dict[str, DispatchSpec] = registered_methods(worker_cls)
        self._bind_worker_methods()

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self._world_size

    # ------------------------------------------------------------------ binding
    def _bind_worker_methods(self) -> None:
        for name, spec in self.method_specs.items():
            if name in self._GROUP_ATTRIBUTES or name.startswith("_"):
                raise TypeError(
                    f"{self.worker_cls.__name__}.{name} is registered, but '{name}' is reserved on worker groups; rename it"
                )
            setattr(self, name, self._make_group_method(name, spec))

    def _make_group_method(self, name: str, spec: DispatchSpec) -> "GroupMethod":
        return GroupMethod(self, name, spec)

    def __getattr__(self, name: str) -> Any:
        specs = self.__dict__.get("method_specs")
        if specs is None or name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"worker group '{self.__dict__.get('role')}' ({self.__dict__['worker_cls'].__name__}) has no registered "
            f"method '{name}'; registered methods: {', '.join(sorted(specs)) or '(none)'}"
        )

    # ------------------------------------------------------------------ calling
    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call registered ``method`` on the group as its spec says (the bound methods use this)."""
        return self._call(method, args, kwargs, force_future=False)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> GroupFuture:
        """Start registered ``method`` and return its future at once (``group.method.submit(...)`` says the same)."""
        return self._call(method, args, kwargs, force_future=True)

    def _call(self, method: str, args: tuple, kwargs: dict, force_future: bool) -> Any:
        spec = self.method_specs.get(method)
        if spec is None:
            raise AttributeError(
                f"worker group '{self.role}' ({self.worker_cls.__name__}) has no registered method '{method}'; "
                f"registered methods: {', '.join(sorted(self.method_specs)) or '(none)'}"
            )
        started = time.time()
        plan = build_plan(self, spec.dispatch_mode, args, kwargs)
        every_rank = spec.execute_mode is Execute.ALL
        if every_rank:
            ranks, rank_args, rank_kwargs = list(range(self.world_size)), plan.rank_args, plan.rank_kwargs
        else:
            ranks, rank_args, rank_kwargs = [0], plan.rank_args[:1], plan.rank_kwargs[:1]
        plain_collect = plan.collect if every_rank else _first_output
        collect = plain_collect
        # The event exists for observers only: with none attached (library use, this benchmark) a call builds none.
        observers = self.observers
        event = self._call_event(method, spec, ranks, plan, started) if observers else None
        if event is not None:
            for observer in observers:
                observer.call_started(event)
        handles = self._launch(method, rank_args, rank_kwargs, ranks)
        if event is not None:
            event.dispatch_s = time.time() - started
            collect = self._reporting(plain_collect, event)
        future = GroupFuture(
            group=self,
            method=method,
            handles=handles,
            collect=collect,
            ranks=ranks,
            layout=plan.layout if every_rank else None,
            plain_collect=plain_collect,
        )
        return future.get() if spec.blocking and not force_future else future

    def _call_event(self, method: str, spec: DispatchSpec, ranks: list[int], plan: CallPlan,
                    started: float) -> DispatchEvent:
        """The event observers receive for one call, with the bytes it sends."""
        return DispatchEvent(
            role=self.role,
            method=method,
            dispatch_mode=spec.dispatch_mode.name,
            execute_mode=spec.execute_mode.value,
            ranks=ranks,
            rows_per_rank=plan.rows_per_rank(),
            started=started,
            bytes_sent=sum(payload_bytes(value) for args_ in plan.rank_args for value in args_)
            + sum(payload_bytes(value) for kwargs_ in plan.rank_kwargs for value in kwargs_.values()),
        )

    def _reporting(self, collect: Callable[[list], Any], event: DispatchEvent) -> Callable[[list], Any]:
        observers = self.observers

        def collect_and_report(outputs: list) -> Any:
            collect_started = time.time()
            result = collect(outputs)
            event.finished = time.time()
            event.collect_s = event.finished - collect_started
            for observer in observers:
                observer.call_finished(event)
            return result

        return collect_and_report

    # ------------------------------------------------------------------ backend hooks
    def _launch(self, method: str, rank_args: list[tuple], rank_kwargs: list[dict], ranks: list[int]) -> list[Any]:
        """Start ``method`` on ``ranks``; returns one handle per rank."""
        raise NotImplementedError

    def _wait(self, method: str, handles: list[Any], ranks: list[int], timeout: float | None) -> list[Any]:
        """Wait for the handles (bounded) and return the per-rank outputs, raising named errors."""
        raise NotImplementedError

    def _ready(self, handles: list[Any]) -> bool:
        raise NotImplementedError

    def drain_rank_spans(self) -> list[tuple[int, str, str, float, float]]:
        """(rank, role, method, start, end) of the calls each rank ran since the last drain."""
        raise NotImplementedError

    def request_rank_spans(self) -> Callable[[float | None], list[tuple[int, str, str, float, float]]]:
        """Ask the ranks for their spans without waiting; calling the result (optionally with a timeout)
        returns what :meth:`drain_rank_spans` would. The request queues behind calls already sent."""
        spans = self.drain_rank_spans()
        return lambda timeout=None: spans

    def shutdown(self) -> None:
        """Release the group's processes."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(role={self.role!r}, worker={self.worker_cls.__name__}, world_size={self.world_size})"
