"""The reward-function contract shared by every task and by user-supplied reward code.

A reward function is called once per batch (or per chunk of ``roles.reward.batch_size`` samples)::

    score(prompts: list[str], responses: list[str], **columns: list[Any], **function_kwargs) -> scores

- ``prompts``: the decoded prompts (special tokens skipped), one per sample;
- ``responses``: the decoded responses (special tokens skipped, so no eos), one per sample;
- ``columns``: every extra dataset column (everything but the prompt), each a list aligned with
  ``prompts`` (e.g. ``ground_truth=[...]``); a function takes the ones it needs by name and
  accepts the rest through ``**columns``;
- ``function_kwargs``: the recipe's ``roles.reward.function_kwargs`` (e.g. ``method="flexible"``),
  the same on every call; a keyword that is also a data column is an error;
- returns, in one of three forms:

  - one float per sample: ``[1.0, 0.0, ...]``;
  - one mapping per sample: ``[{"score": 1.0, "acc": True, "format": 0.5, "pred": "42"}, ...]``, where
    ``score`` is the reward and every other numeric entry (a bool counts as 0/1) is a *named score*;
    non-numeric entries (``"pred"``, a parsed answer) are ignored;
  - one mapping of name -> list (column form): ``{"score": [1.0, 0.0], "acc": [1, 0]}``.

  Every sample carries the same named scores. The reward worker returns each as a float column
  ``reward/<name>`` (:func:`named_score_column`), logged as ``reward/<name>/mean``; a name is non-empty
  and has no ``/``, and ``score`` itself is not repeated as a named column.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

__all__ = [
    "NAMED_SCORE_PREFIX",
    "RewardFn",
    "check_reward_inputs",
    "named_score_column",
    "named_score_names",
    "named_score_problem",
]

NAMED_SCORE_PREFIX = "reward/"
"""The prefix of the batch column holding a named score: ``reward/acc`` holds the scores named ``acc``."""


class RewardFn(Protocol):
    """Anything callable as ``fn(prompts, responses, **columns)`` returning floats or named scores."""

    def __call__(self, prompts: list[str], responses: list[str], **columns: Any) -> Any: ...


def named_score_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a score (it must be a non-empty string without ``/``, and not ``score``), or None."""
    if not isinstance(name, str) or not name:
        return f"a named score needs a non-empty string name, got {name!r}"
    if "/" in name:
        return f"the named score {name!r} has a '/'; use a name without one (it becomes the column {NAMED_SCORE_PREFIX}<name>)"
    if name == "score":
        return "'score' is the reward itself, not a named score"
    return None


def named_score_column(name: str) -> str:
    """The batch column of the named score ``name``: ``reward/<name>`` (the reward worker writes only names
    that :func:`named_score_problem` accepts)."""
    return NAMED_SCORE_PREFIX + name


def named_score_names(columns: Iterable[str]) -> list[str]:
    """The score names of a batch's named-score columns, in column order (``["reward/acc", "uid"]`` -> ``["acc"]``)."""
    return [column[len(NAMED_SCORE_PREFIX):] for column in columns if str(column).startswith(NAMED_SCORE_PREFIX)]


def check_reward_inputs(prompts: Sequence[Any], responses: Sequence[Any], **columns: Sequence[Any]) -> None:
    """Reject batches whose prompts, responses and columns do not line up one per sample."""
    if len(prompts) != len(responses):
        raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses; they must pair up one to one")
    for name, values in columns.items():
        if len(values) != len(responses):
            raise ValueError(
                f"column {name!r} has {len(values)} values for {len(responses)} responses; "
                "every column must hold one value per sample"
            )
