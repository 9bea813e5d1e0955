"""The single controller: one driver calls methods on groups of workers; ``@register`` says how.

Public API (stable import paths)::

    from rlhfctl.single_controller import (register, Dispatch, Execute, Worker, WorkerGroup, ResourcePool,
        ClassWithInitArgs, RayResourcePool, RayClassWithInitArgs, RayWorkerGroup, register_dispatch_mode,
        GroupFuture, union_pending)
"""

from rlhfctl.single_controller.decorator import (
    Dispatch,
    DispatchMode,
    DispatchSpec,
    Execute,
    get_dispatch_spec,
    register,
    register_dispatch_mode,
    registered_methods,
)
from rlhfctl.single_controller.errors import (
    ResourcePoolError,
    WorkerDiedError,
    WorkerGroupError,
    WorkerMethodError,
    WorkerTimeoutError,
)
from rlhfctl.single_controller.futures import GroupFuture, PendingUnion, union_pending
from rlhfctl.single_controller.host import ClassWithInitArgs
from rlhfctl.single_controller.local_backend import LocalWorkerGroup
from rlhfctl.single_controller.ray_backend import RayClassWithInitArgs, RayWorkerGroup
from rlhfctl.single_controller.resource_pool import RayResourcePool, ResourcePool
from rlhfctl.single_controller.worker import Worker
from rlhfctl.single_controller.worker_group import DispatchEvent, WorkerGroup

__all__ = [
    "ClassWithInitArgs",
    "Dispatch",
    "DispatchEvent",
    "DispatchMode",
    "DispatchSpec",
    "Execute",
    "GroupFuture",
    "LocalWorkerGroup",
    "PendingUnion",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePool",
    "ResourcePoolError",
    "Worker",
    "WorkerDiedError",
    "WorkerGroup",
    "WorkerGroupError",
    "WorkerMethodError",
    "WorkerTimeoutError",
    "get_dispatch_spec",
    "register",
    "register_dispatch_mode",
    "registered_methods",
    "union_pending",
]
