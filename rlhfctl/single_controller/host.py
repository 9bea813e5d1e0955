"""WorkerHost: the process-side container that builds one rank's role workers and runs their methods.

On the Ray backend each rank is one Ray actor running a WorkerHost; colocated roles are several workers
inside the same host (one process, one GPU). The local backend uses the same class in the driver.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from rlhfctl.library_output import quiet_this_process
from rlhfctl.single_controller import rank_progress
from rlhfctl.single_controller import worker as worker_module
from rlhfctl.single_controller.decorator import registered_methods
from rlhfctl.single_controller.worker import RankInfo, free_port, node_ip_address


@dataclass
class ClassWithInitArgs:
    """A worker class and its constructor arguments, built later inside the worker process."""

    cls: type
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        self.cls = _unwrap_remote_class(cls)
        self.args = args
        self.kwargs = kwargs

    def build(self) -> Any:
        """Construct the worker."""
        return self.cls(*self.args, **self.kwargs)


def _unwrap_remote_class(cls: Any) -> type:
    """Accept a ``@ray.remote`` class as well as a plain one: groups create the processes themselves."""
    if isinstance(cls, type):
        return cls
    metadata = getattr(cls, "__ray_metadata__", None)
    modified = getattr(metadata, "modified_class", None)
    if modified is not None:
        # Ray's wrapper subclasses the user's class and keeps it as __ray_actor_class__.
        return getattr(modified, "__ray_actor_class__", modified)
    raise TypeError(f"a worker class must be a class or a @ray.remote class, got {type(cls).__name__}")


def torch_threads_for(local_processes: int) -> int:
    """Intra-op threads per worker so the processes on one machine do not oversubscribe its cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_processes))


class WorkerHost:
    """Builds the role workers of one rank and calls their methods by role and name."""

    def __init__(self, env_vars: dict[str, str] | None = None) -> None:
        os.environ.update(env_vars or {})
        quiet_this_process()  # libraries' own bars and warnings stay off the console unless RLHFCTL_VERBOSE=1
        self.workers: dict[str, Any] = {}
        self.rank_info: RankInfo | None = None
        # (role, method, start, end) of recent calls, drained by the dispatch trace; bounded memory.
        self.spans: deque[tuple[str, str, float, float]] = deque(maxlen=100_000)

    def rendezvous_address(self) -> tuple[str, int]:
        """Address and a free port on this host's node, for rank 0's torch.distributed rendezvous."""
        return node_ip_address(), free_port()

    def build(self, rank_info: RankInfo, roles: dict[str, ClassWithInitArgs], num_threads: int | None = None,
              set_environ: bool = True) -> int:
        """Construct this rank's workers (one per role); returns the process id."""
        self.rank_info = rank_info
        if set_environ:
            os.environ.update(rank_info.env())
            if num_threads:
                torch.set_num_threads(num_threads)
                os.environ.setdefault("OMP_NUM_THREADS", str(num_threads))
        previous = worker_module._constructing_rank
        worker_module._constructing_rank = rank_info
        try:
            for role, spec in roles.items():
                self.workers[role] = spec.build()
        finally:
            worker_module._constructing_rank = previous
        return os.getpid()

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``role``'s registered ``method`` on this rank, recording its wall-clock span."""
        start = time.time()
        rank = self.rank_info.rank if self.rank_info is not None else 0
        worker = self.workers[role]
        try:
            with rank_progress.calling(role, method, rank):  # what report() inside the method is about
                return getattr(worker, method)(*args, **kwargs)
        finally:
            self.spans.append((role, method, start, time.time()))
            # Phases a worker times inside a call (the vllm engine's wake / sync / generate / sleep).
            inner = getattr(worker, "take_inner_spans", None)
            if callable(inner):
                self.spans.extend((role, name, begin, end) for name, begin, end in inner())

    def drain_spans(self) -> list[tuple[str, str, float, float]]:
        """Return and forget the spans recorded since the last drain."""
        spans = list(self.spans)
        self.spans.clear()
        return spans

    def pid(self) -> int:
        """This host's process id."""
        return os.getpid()


def direct_method_name(role: str, method: str) -> str:
    """Name of the host method that runs ``role.method`` directly (see :func:`host_class_for`)."""
    return f"{role}__{method}"


def _direct_call(role: str, method: str) -> Any:
    def direct(self: WorkerHost, *args: Any, **kwargs: Any) -> Any:
        return self.call(role, method, *args, **kwargs)

    direct.__name__ = direct.__qualname__ = direct_method_name(role, method)
    direct.__doc__ = f"{role}.{method} on this rank."
    return direct


def host_class_for(roles: dict[str, ClassWithInitArgs]) -> type:
    """A WorkerHost with one method per registered ``role.method``, so a Ray call names its target
    by the actor method it invokes instead of sending role and method name as two extra arguments
    (each argument costs about 0.2 ms per call on Ray). :meth:`WorkerHost.call` still serves any other."""
    targets: dict[str, list[tuple[str, str]]] = {}
    for role, spec in roles.items():
        for method in registered_methods(spec.cls):
            targets.setdefault(direct_method_name(role, method), []).append((role, method))
    # A name two (role, method) pairs would share ("a" + "b__c", "a__b" + "c") gets no direct method:
    # both go through call(), which cannot mix them up.
    methods = {
        name: _direct_call(*pairs[0])
        for name, pairs in targets.items()
        if len(pairs) == 1 and name.isidentifier() and not hasattr(WorkerHost, name)
    }
    return type("WorkerHost", (WorkerHost,), {"__doc__": WorkerHost.__doc__, **methods})
