"""The batch side of the reward contract, for the bundled rewards: columns that line up, text that is text.

A bundled reward is called as ``fn(prompts, responses, **columns)`` (see :mod:`rlhfctl.tasks.reward_fn`).
Besides the data columns, ``columns`` may hold plain settings from ``roles.reward.function_kwargs``
meant for another reward (``dispatch_by_source`` and ``combined`` pass theirs along). So here a
*column* is a ``list`` or ``tuple`` and must hold one value per sample; any other value is a setting
and is passed through untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlhfctl.tasks.reward_fn import check_reward_inputs

__all__ = ["as_text", "check_batch", "is_column", "take_rows"]


def is_column(value: Any) -> bool:
    """Whether ``value`` is a per-sample column (a list or tuple) rather than a setting."""
    return isinstance(value, (list, tuple))


def check_batch(prompts: Sequence[Any], responses: Sequence[Any], **columns: Any) -> None:
    """Reject a batch whose prompts, responses and list-valued columns do not pair up one per sample."""
    check_reward_inputs(prompts, responses, **{name: value for name, value in columns.items() if is_column(value)})


def take_rows(columns: Mapping[str, Any], rows: Sequence[int]) -> dict[str, Any]:
    """The ``rows`` of every column (in that order); settings are passed through as they are."""
    return {name: [value[row] for row in rows] if is_column(value) else value for name, value in columns.items()}


def as_text(value: Any) -> str:
    """A response or answer as a string: None is ``""``, bytes are decoded, anything else is ``str(value)``.

    Model output is scored, never trusted: this never raises.
    """
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    try:
        return str(value)
    except Exception:  # noqa: BLE001  (a value whose __str__ raises: score it as empty)
        return ""
