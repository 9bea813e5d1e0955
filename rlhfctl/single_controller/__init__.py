"""The single controller: one driver calls methods on groups of workers; ``@register`` says how.

Public API (stable import paths)::

    from rlhfctl.single_controller import (register, Dispatch, Execute, Worker, WorkerGroup, ResourcePool,
        ClassWithInitArgs, RayResourcePool, RayClassWithInitArgs, RayWorkerGroup, register_dispatch_mode,
        GroupFuture, union_pending)

The names are imported on first use, so that light modules of the package (``rank_progress``, which the
CLI's reporters read) load without torch and Ray.
"""

from __future__ import annotations

from rlhfctl.lazy_exports import lazy_exports

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
    "WorkerMethodLost",
    "WorkerTimeoutError",
    "get_dispatch_spec",
    "register",
    "register_dispatch_mode",
    "registered_methods",
    "union_pending",
]

_LAZY = {
    "Dispatch": "rlhfctl.single_controller.decorator",
    "DispatchMode": "rlhfctl.single_controller.decorator",
    "DispatchSpec": "rlhfctl.single_controller.decorator",
    "Execute": "rlhfctl.single_controller.decorator",
    "get_dispatch_spec": "rlhfctl.single_controller.decorator",
    "register": "rlhfctl.single_controller.decorator",
    "register_dispatch_mode": "rlhfctl.single_controller.decorator",
    "registered_methods": "rlhfctl.single_controller.decorator",
    "ResourcePoolError": "rlhfctl.single_controller.errors",
    "WorkerDiedError": "rlhfctl.single_controller.errors",
    "WorkerGroupError": "rlhfctl.single_controller.errors",
    "WorkerMethodError": "rlhfctl.single_controller.errors",
    "WorkerMethodLost": "rlhfctl.single_controller.errors",
    "WorkerTimeoutError": "rlhfctl.single_controller.errors",
    "GroupFuture": "rlhfctl.single_controller.futures",
    "PendingUnion": "rlhfctl.single_controller.futures",
    "union_pending": "rlhfctl.single_controller.futures",
    "ClassWithInitArgs": "rlhfctl.single_controller.host",
    "LocalWorkerGroup": "rlhfctl.single_controller.local_backend",
    "RayClassWithInitArgs": "rlhfctl.single_controller.ray_backend",
    "RayWorkerGroup": "rlhfctl.single_controller.ray_backend",
    "RayResourcePool": "rlhfctl.single_controller.resource_pool",
    "ResourcePool": "rlhfctl.single_controller.resource_pool",
    "Worker": "rlhfctl.single_controller.worker",
    "DispatchEvent": "rlhfctl.single_controller.worker_group",
    "WorkerGroup": "rlhfctl.single_controller.worker_group",
}

__getattr__ = lazy_exports(__name__, _LAZY)
