"""verl's prompt layout, read as it is: chat-message prompts and the ground truth under ``reward_model``.

A row of verl's preprocessed data (``examples/data_preprocess/gsm8k.py``) looks like::

    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "..."}], "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"}, "extra_info": {"split": "train", "index": 0}}

Two rules make such a file train unchanged, each written once here:

- :func:`uses_chat_template`: with ``data.apply_chat_template`` null, a prompt that is a list of
  ``{role, content}`` messages is rendered with the tokenizer's chat template and a string is used as it
  is; true renders every prompt (a string becomes one user message), false none (a list is an error);
- :func:`reward_columns`: every column of a record but the prompt goes to the reward function as it is
  (``data_source``, ``ability``, ``reward_model`` and ``extra_info`` included), plus ``ground_truth``
  lifted from ``reward_model.ground_truth`` when the record has no top-level ``ground_truth`` (or it is
  null).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlhfctl.data.errors import DataFileError

__all__ = [
    "GROUND_TRUTH",
    "NESTED_GROUND_TRUTH",
    "ground_truth_key",
    "prompt_messages",
    "reward_columns",
    "uses_chat_template",
]

GROUND_TRUTH = "ground_truth"
"""The column reward functions read the reference answer from."""
NESTED_GROUND_TRUTH = "reward_model.ground_truth"
"""Where verl's preprocessed data keeps it."""
_NESTED_SECTION = "reward_model"


def uses_chat_template(setting: bool | None, prompt: Any) -> bool:
    """Whether this prompt is rendered with the chat template under ``data.apply_chat_template`` = ``setting``."""
    if setting is None:
        return isinstance(prompt, (list, tuple))
    return bool(setting)


def prompt_messages(prompt: Any, setting: bool | None, source: str, number: int) -> list[dict[str, Any]] | None:
    """The messages to render with the chat template, or None for a text prompt used as it is; DataFileError
    naming the record for a prompt the setting cannot use (run time and validate's sample alike)."""
    if uses_chat_template(setting, prompt):
        return _as_messages(prompt, source, number)
    if isinstance(prompt, str):
        return None
    if isinstance(prompt, (list, tuple)):
        raise DataFileError(
            f"{source}: record {number}: the prompt is a list of messages; set apply_chat_template to null or true "
            "(data.apply_chat_template) to render it with the chat template"
        )
    raise DataFileError(f"{source}: record {number}: the prompt must be a string, got {type(prompt).__name__}")


def _as_messages(prompt: Any, source: str, number: int) -> list[dict[str, Any]]:
    """A string becomes one user message; a list must already be {role, content} messages."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)) and prompt:
        for position, message in enumerate(prompt, start=1):
            if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
                raise DataFileError(
                    f"{source}: record {number}: message {position} must be a mapping with 'role' and 'content'"
                )
        return [dict(message) for message in prompt]
    raise DataFileError(
        f"{source}: record {number}: the prompt must be a string or a non-empty list of "
        f"{{role, content}} messages, got {type(prompt).__name__}"
    )


def ground_truth_key(record: Mapping[str, Any]) -> str | None:
    """Which key gives the record its ground truth: ``ground_truth``, ``reward_model.ground_truth`` (when the
    top-level one is absent or null), or None when it has neither (a null value still names its key)."""
    nested = record.get(_NESTED_SECTION)
    if record.get(GROUND_TRUTH) is None and isinstance(nested, Mapping) and GROUND_TRUTH in nested:
        return NESTED_GROUND_TRUTH
    return GROUND_TRUTH if GROUND_TRUTH in record else None


def reward_columns(record: Mapping[str, Any], prompt_key: str) -> dict[str, Any]:
    """The columns the reward function gets for this record: all but the prompt, values untouched, with
    ``ground_truth`` lifted from ``reward_model.ground_truth`` (see :func:`ground_truth_key`)."""
    columns = {key: value for key, value in record.items() if key != prompt_key}
    if ground_truth_key(record) == NESTED_GROUND_TRUTH:
        columns[GROUND_TRUTH] = record[_NESTED_SECTION][GROUND_TRUTH]
    return columns
