"""``@register``: declare how a worker method is called by its group.

``register`` only attaches a :class:`DispatchSpec` to the method and, inside the worker, resolves
futures among the arguments. The :class:`~rlhfctl.single_controller.worker_group.WorkerGroup` reads
the spec once, at construction, and builds the group method from it.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Callable

from rlhfctl.single_controller.futures import materialize
from rlhfctl.single_controller.input_guard import check_inputs_enabled, fingerprint_inputs, verify_inputs

__all__ = [
    "Dispatch",
    "DispatchMode",
    "DispatchSpec",
    "Execute",
    "get_dispatch_spec",
    "register",
    "register_dispatch_mode",
    "registered_methods",
]

_SPEC_ATTR = "__rlhfctl_dispatch_spec__"


@dataclass(frozen=True)
class DispatchMode:
    """A named way to split arguments across ranks and join results; built-ins or user-registered."""

    name: str
    dispatch_fn: Callable[..., tuple[tuple, dict]] | None = None
    collect_fn: Callable[..., Any] | None = None

    @property
    def is_builtin(self) -> bool:
        return self.dispatch_fn is None

    def __repr__(self) -> str:
        return f"Dispatch.{self.name}"

    def __str__(self) -> str:
        return self.name


class Dispatch:
    """The dispatch modes: ONE_TO_ALL, ALL_TO_ALL, ONE_TO_ONE plus any added by register_dispatch_mode."""

    ONE_TO_ALL = DispatchMode("ONE_TO_ALL")
    ALL_TO_ALL = DispatchMode("ALL_TO_ALL")
    ONE_TO_ONE = DispatchMode("ONE_TO_ONE")

    @classmethod
    def modes(cls) -> dict[str, DispatchMode]:
        """Every known mode by name."""
        return {name: value for name, value in vars(cls).items() if isinstance(value, DispatchMode)}


class Execute(enum.Enum):
    """Which ranks run a call: every rank, or rank 0 alone."""

    ALL = "ALL"
    RANK_ZERO = "RANK_ZERO"

    def __str__(self) -> str:
        return self.value


def register_dispatch_mode(
    name: str,
    dispatch_fn: Callable[..., tuple[tuple, dict]],
    collect_fn: Callable[..., Any],
) -> DispatchMode:
    """Add ``Dispatch.<NAME>``: ``dispatch_fn(group, *args, **kwargs) -> (args, kwargs)`` with lists of
    length world_size, and ``collect_fn(group, outputs) -> result``."""
    key = name.upper()
    if not key.isidentifier():
        raise ValueError(f"dispatch mode name must be an identifier, got {name!r}")
    existing = Dispatch.modes().get(key)
    if existing is not None and existing.is_builtin:
        raise ValueError(f"Dispatch.{key} is a built-in mode and cannot be redefined")
    if not callable(dispatch_fn) or not callable(collect_fn):
        raise TypeError("register_dispatch_mode needs callable dispatch_fn and collect_fn")
    mode = DispatchMode(key, dispatch_fn, collect_fn)
    setattr(Dispatch, key, mode)
    return mode


def _as_mode(dispatch_mode: DispatchMode | dict | str) -> DispatchMode:
    if isinstance(dispatch_mode, DispatchMode):
        return dispatch_mode
    if isinstance(dispatch_mode, str):
        mode = Dispatch.modes().get(dispatch_mode.upper())
        if mode is None:
            raise ValueError(f"unknown dispatch mode {dispatch_mode!r}; known: {sorted(Dispatch.modes())}")
        return mode
    if isinstance(dispatch_mode, dict):
        missing = {"dispatch_fn", "collect_fn"} - set(dispatch_mode)
        if missing:
            raise ValueError(f"a custom dispatch_mode dict needs keys dispatch_fn and collect_fn; missing {sorted(missing)}")
        fn = dispatch_mode["dispatch_fn"]
        return DispatchMode(f"CUSTOM[{getattr(fn, '__name__', 'fn')}]", fn, dispatch_mode["collect_fn"])
    raise TypeError(f"dispatch_mode must be a Dispatch mode, its name or a dict, got {type(dispatch_mode).__name__}")


@dataclass(frozen=True)
class DispatchSpec:
    """How a registered method is called by its group: the metadata ``register`` attaches."""

    dispatch_mode: DispatchMode
    execute_mode: Execute
    blocking: bool
    materialize_futures: bool

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly view, used by ``rlhfctl inspect-dispatch``."""
        return {
            "dispatch_mode": self.dispatch_mode.name,
            "execute_mode": self.execute_mode.value,
            "blocking": self.blocking,
            "materialize_futures": self.materialize_futures,
        }


def register(
    dispatch_mode: DispatchMode | dict | str = Dispatch.ALL_TO_ALL,
    execute_mode: Execute | str = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
) -> Callable[[Callable], Callable]:
    """Mark a worker method as callable on its group, with how its data is split and collected."""
    spec = DispatchSpec(
        dispatch_mode=_as_mode(dispatch_mode),
        execute_mode=Execute(execute_mode) if not isinstance(execute_mode, Execute) else execute_mode,
        blocking=bool(blocking),
        materialize_futures=bool(materialize_futures),
    )

    def decorator(method: Callable) -> Callable:
        if spec.materialize_futures:

            @functools.wraps(method)
            def inner(*args: Any, **kwargs: Any) -> Any:
                args = tuple(materialize(arg) for arg in args)
                kwargs = {key: materialize(value) for key, value in kwargs.items()}
                return _call_checked(method, args, kwargs)

        else:

            @functools.wraps(method)
            def inner(*args: Any, **kwargs: Any) -> Any:
                return _call_checked(method, args, kwargs)

        setattr(inner, _SPEC_ATTR, spec)
        return inner

    return decorator


def _call_checked(method: Callable, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``method``; with RLHFCTL_CHECK_INPUTS=1, fail if it wrote in place into a DataProto it was sent."""
    if not check_inputs_enabled():
        return method(*args, **kwargs)
    before = fingerprint_inputs(args, kwargs)
    result = method(*args, **kwargs)
    verify_inputs(before, method.__qualname__)
    return result


def get_dispatch_spec(method: Callable) -> DispatchSpec | None:
    """The spec ``register`` attached to ``method``, or None when it is not registered."""
    return getattr(method, _SPEC_ATTR, None)


def registered_methods(worker_cls: type) -> dict[str, DispatchSpec]:
    """Every registered method of a worker class (inherited ones too), by name, in name order."""
    found: dict[str, DispatchSpec] = {}
    for name in dir(worker_cls):
        if name.startswith("__"):
            continue
        spec = get_dispatch_spec(getattr(worker_cls, name, None))
        if spec is not None:
            found[name] = spec
    return found
