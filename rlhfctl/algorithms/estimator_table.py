"""The table of advantage estimators by name, and the decorator that fills it.

Kept apart from :mod:`rlhfctl.algorithms.registry` (lookup and the uniform call) so the built-in estimators can
register themselves without importing the registry that imports them: imports point one way, table <- estimators <-
registry.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping, TypeVar

import torch

__all__ = ["ADVANTAGE_ESTIMATORS", "AdvantageFn", "register_advantage_estimator"]

#: What an estimator is: keyword tensors in, ``(advantages, returns)`` out.
AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
F = TypeVar("F", bound=AdvantageFn)

_REGISTRY: dict[str, AdvantageFn] = {}

#: Read-only live view of the registered estimators, name -> function. ``list(...)`` gives the
#: names; it also reflects estimators registered later (custom ones).
ADVANTAGE_ESTIMATORS: Mapping[str, AdvantageFn] = MappingProxyType(_REGISTRY)

def _same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    # A module that is imported twice (reload, or by path and by name) re-registers a new
    # function object with the same identity; that is not a conflict.
    return a is b or (
        getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
    )


def register_advantage_estimator(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Decorator registering an advantage estimator under ``name``.

    The function must return ``(advantages, returns)``, each of shape (batch, response_len).
    Registering a different function under a taken name raises ``ValueError`` unless
    ``override=True``.

    Example::

        @register_advantage_estimator("my_est")
        def my_est(token_level_rewards, response_mask, index): ...
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"advantage estimator name must be a non-empty string, got {name!r}")

    def decorator(fn: F) -> F:
        existing = _REGISTRY.get(name)
        if existing is not None and not override and not _same_function(existing, fn):
            raise ValueError(
                f"advantage estimator {name!r} is already registered to "
                f"{existing.__module__}.{existing.__qualname__}; pass override=True to replace it"
            )
        _REGISTRY[name] = fn
        return fn

    return decorator
