"""Choice lists that come from other packages, looked up by name when a value is checked."""

from __future__ import annotations

from typing import Callable

__all__ = ["choices_for"]

_DTYPES = ("float32", "fp32", "float16", "fp16", "half", "bfloat16", "bf16", "auto")
_KL_KIND_ALIASES = ("kl", "mse", "low_var_kl")


def _loss_agg_modes() -> tuple[str, ...]:
    from rlhfctl.algorithms.losses import LOSS_AGG_MODES

    return tuple(LOSS_AGG_MODES)


def _kl_kinds() -> tuple[str, ...]:
    from rlhfctl.algorithms.kl import KL_KINDS

    return tuple(KL_KINDS) + _KL_KIND_ALIASES


def _tasks() -> tuple[str, ...]:
    from rlhfctl.tasks import task_names

    return tuple(task_names())


def _overlong() -> tuple[str, ...]:
    from rlhfctl.data.prompts import OVERLONG_POLICIES

    return tuple(OVERLONG_POLICIES)


_PROVIDERS: dict[str, Callable[[], tuple[str, ...]]] = {
    "dtypes": lambda: _DTYPES,
    "loss_agg_modes": _loss_agg_modes,
    "kl_kinds": _kl_kinds,
    "tasks": _tasks,
    "overlong": _overlong,
}


def choices_for(spec: tuple[str, ...] | str) -> tuple[str, ...]:
    """The allowed values for a field's ``choices`` metadata (a tuple, or a provider name)."""
    if isinstance(spec, str):
        return _PROVIDERS[spec]()
    return tuple(spec)
