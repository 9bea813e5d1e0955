"""Which worker class runs a role: the built-in defaults, or any importable ``module:Class``."""

from __future__ import annotations

import importlib

from rlhfctl.single_controller import Worker

__all__ = ["DEFAULT_WORKERS", "resolve_worker_class"]

DEFAULT_WORKERS: dict[str, str] = {
    "actor": "workers.actor:ActorWorker",
    "critic": "workers.critic:CriticWorker",
    "reference": "workers.reference:ReferenceWorker",
    "reward": "workers.reward:RewardWorker",
}


def resolve_worker_class(role: str, spec: str | None = None) -> type[Worker]:
    """Import ``spec`` (``"package.module:Class"``), or the default class of ``role``; it must subclass
    :class:`rlhfctl.single_controller.Worker` and is constructed as ``Cls(recipe, role)``."""
    spec = spec or DEFAULT_WORKERS.get(role)
    if spec is None:
        raise ValueError(
            f"role {role!r} has no default worker class; set roles.{role}.worker to 'package.module:Class' "
            f"(defaults exist for {', '.join(sorted(DEFAULT_WORKERS))})"
        )
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"a worker class is named 'package.module:Class', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot import module {module_name!r} for the {role} worker {spec!r}: {error}") from error
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise ValueError(f"{spec!r} names no class in {module_name!r}")
    if not issubclass(cls, Worker):
        raise TypeError(f"the {role} worker {spec!r} must subclass rlhfctl.single_controller.Worker")
    return cls
