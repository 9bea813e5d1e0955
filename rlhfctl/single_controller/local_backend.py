"""The local backend: the same worker classes and dispatch semantics, run in the driver process.

Ranks run one after another in this process, so a breakpoint in a worker method stops the run right
there. Arguments are deep-copied per rank, as a process boundary would, so workers never see (or
modify) the caller's objects. torch.distributed is not available across local ranks: use one rank
for workers that call ``init_distributed``.
"""

from __future__ import annotations

import copy
import traceback
from typing import Any

from rlhfctl.single_controller.errors import method_error
from rlhfctl.single_controller.host import ClassWithInitArgs, WorkerHost
from rlhfctl.single_controller.resource_pool import ResourcePool
from rlhfctl.single_controller.worker import RankInfo, free_port
from rlhfctl.single_controller.worker_group import WorkerGroup


class _Outcome:
    """A finished local call: its value, or the error and traceback it raised."""

    __slots__ = ("value", "error", "traceback")

    def __init__(self, value: Any = None, error: BaseException | None = None, tb: str = "") -> None:
        self.value, self.error, self.traceback = value, error, tb


def _build_hosts(world_size: int, roles: dict[str, ClassWithInitArgs]) -> list[WorkerHost]:
    port = free_port()
    hosts = []
    for rank in range(world_size):
        host = WorkerHost()
        host.build(RankInfo(rank, world_size, rank, world_size, "127.0.0.1", port), roles, set_environ=False)
        hosts.append(host)
    return hosts


class LocalWorkerGroup(WorkerGroup):
    """A WorkerGroup whose ranks are objects in the driver process (for debugging and tests)."""

    backend = "local"

    def __init__(self, resource_pool: ResourcePool | int, cls_with_init: ClassWithInitArgs, role: str = "worker",
                 call_timeout_s: float | None = None, _hosts: list[WorkerHost] | None = None) -> None:
        if not isinstance(cls_with_init, ClassWithInitArgs):
            cls_with_init = ClassWithInitArgs(cls_with_init)
        world_size = resource_pool if isinstance(resource_pool, int) else resource_pool.world_size
        super().__init__(role, cls_with_init.cls, world_size, call_timeout_s)
        self._hosts = _hosts if _hosts is not None else _build_hosts(world_size, {role: cls_with_init})

    @classmethod
    def create_colocated(cls, resource_pool: ResourcePool | int, roles: dict[str, ClassWithInitArgs],
                         call_timeout_s: float | None = None) -> dict[str, "LocalWorkerGroup"]:
        """Several roles sharing one host per rank; returns a group per role."""
        roles = {role: spec if isinstance(spec, ClassWithInitArgs) else ClassWithInitArgs(spec) for role, spec in roles.items()}
        world_size = resource_pool if isinstance(resource_pool, int) else resource_pool.world_size
        hosts = _build_hosts(world_size, roles)
        return {role: cls(world_size, spec, role, call_timeout_s, _hosts=hosts) for role, spec in roles.items()}

    @property
    def workers(self) -> list[Any]:
        """The worker object of each rank (local backend only: handy in a debugger)."""
        return [host.workers[self.role] for host in self._hosts]

    def _launch(self, method: str, rank_args: list[tuple], rank_kwargs: list[dict], ranks: list[int]) -> list[Any]:
        outcomes = []
        for rank, args, kwargs in zip(ranks, rank_args, rank_kwargs):
            args, kwargs = copy.deepcopy((args, kwargs))
            try:
                outcomes.append(_Outcome(self._hosts[rank].call(self.role, method, *args, **kwargs)))
            except Exception as error:  # noqa: BLE001 - reported with rank and traceback on wait
                outcomes.append(_Outcome(error=error, tb=traceback.format_exc()))
        return outcomes

    def _wait(self, method: str, handles: list[Any], ranks: list[int], timeout: float | None) -> list[Any]:
        for rank, outcome in zip(ranks, handles):
            if outcome.error is not None:
                error = outcome.error
                raise method_error(self.role, self.worker_cls.__name__, method, rank, error,
                                   f"{type(error).__name__}: {error}", outcome.traceback) from error
        return [outcome.value for outcome in handles]

    def _ready(self, handles: list[Any]) -> bool:
        return True

    def drain_rank_spans(self) -> list[tuple[int, str, str, float, float]]:
        """(rank, role, method, start, end) recorded since the last drain."""
        return [(rank, *span) for rank, host in enumerate(self._hosts) for span in host.drain_spans()]
