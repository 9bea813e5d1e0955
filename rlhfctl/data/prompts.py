"""Prompt datasets for RL training: render, tokenize, bound the length, and collate prompts.

A record is a dict with the prompt under ``prompt_key`` plus any other columns (``ground_truth``,
``data_source``, ...). The extra columns ride along with each prompt so reward functions get them
as keyword lists (see :mod:`rlhfctl.tasks`). Which prompts get the chat template, and the
``ground_truth`` of verl's layout (``reward_model.ground_truth``), follow :mod:`rlhfctl.data.verl_layout`.

Prompts longer than ``max_prompt_length`` tokens follow the ``overlong`` policy:

- ``"error"`` (default): stop with the source, record number, length and limit;
- ``"truncate"``: keep the LAST ``max_prompt_length`` tokens (left-truncation). The end of a
  prompt holds the question and, with a chat template, the ``assistant`` turn the model must
  continue from; dropping the start (usually instructions or few-shot examples) hurts least;
- ``"skip"``: drop the record and count it in ``PromptDataset.skipped``.

This module also re-exports :func:`load_records`, :class:`PromptBatcher` and the error types, so
``rlhfctl.data.prompts`` is the one import a trainer needs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch

from rlhfctl.data.batching import PromptBatcher
from rlhfctl.data.choices import OVERLONG_POLICIES
from rlhfctl.data.errors import DataConfigError, DataFileError
from rlhfctl.data.records import SUPPORTED_EXTENSIONS, load_records
from rlhfctl.data.verl_layout import prompt_messages, reward_columns

__all__ = [
    "OVERLONG_POLICIES",
    "SUPPORTED_EXTENSIONS",
    "DataConfigError",
    "DataFileError",
    "PromptBatch",
    "PromptBatcher",
    "PromptDataset",
    "PromptRow",
    "collate_prompts",
    "load_records",
    "prompt_of",
]


@dataclass(frozen=True)
class PromptRow:
    """One prompt ready for generation, with the record's other columns for the reward."""

    index: int
    """0-based position of the record in the source (before any were skipped)."""
    prompt_ids: tuple[int, ...]
    prompt_text: str
    """The text the model sees: rendered (chat template applied), and truncated like the ids."""
    columns: Mapping[str, Any] = field(default_factory=dict)
    messages: tuple[Mapping[str, Any], ...] | None = None
    """The chat the text was rendered from (the chat template), so a reward model can render it its own way."""


class PromptBatch(NamedTuple):
    """A collated batch: left-padded ids, their mask, and per-column lists for reward functions."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    columns: dict[str, list[Any]]


class PromptDataset(Sequence[PromptRow]):
    """Validated, tokenized prompts from a list of records (see the module doc for ``overlong``)."""

    def __init__(
        self,
        records: Iterable[Mapping[str, Any]],
        prompt_key: str = "prompt",
        tokenizer: Any = None,
        max_prompt_length: int | None = None,
        overlong: str = "error",
        apply_chat_template: bool | None = False,
        source: str = "<records>",
        chat_tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        if tokenizer is None:
            raise TypeError("PromptDataset needs a tokenizer (tokenizer=...)")
        if overlong not in OVERLONG_POLICIES:
            raise DataConfigError(f"unknown overlong policy {overlong!r}; use one of {', '.join(OVERLONG_POLICIES)}")
        if max_prompt_length is not None and max_prompt_length < 1:
            raise DataConfigError(f"max_prompt_length must be a positive number of tokens, got {max_prompt_length}")
        if apply_chat_template and not getattr(tokenizer, "chat_template", None):
            raise DataConfigError(
                f"{source}: apply_chat_template is set but the tokenizer has no chat template; set "
                "roles.actor.model.chat_template, use a chat model's tokenizer (roles.actor.model.tokenizer_path), "
                "or set data.apply_chat_template to null "
                "(text prompts as they are)"
            )
        self.source = source
        self.chat_tools = list(chat_tools) if chat_tools else None
        """Function schemas the chat template shows the model (agent rollouts' tools), or None."""
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.overlong = overlong
        self.skipped = 0
        """Records dropped by ``overlong="skip"``."""
        self.truncated = 0
        """Records shortened by ``overlong="truncate"``."""

        records = list(records)
        rendered = [self._render(record, number, tokenizer, apply_chat_template) for number, record in enumerate(records, 1)]
        texts = [text for text, _ in rendered]
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        self._rows: list[PromptRow] = []
        for index, (record, (text, chat), ids) in enumerate(zip(records, rendered, encoded)):
            row = self._bound(index, record, text, list(ids), tokenizer)
            if row is not None:
                self._rows.append(row if chat is None else replace(row, messages=tuple(chat)))
        if records and not self._rows:
            raise DataFileError(
                f"{source}: all {len(records)} prompts are longer than max_prompt_length={max_prompt_length} "
                "tokens and were skipped; raise max_prompt_length or use overlong='truncate'"
            )

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **kwargs: Any) -> PromptDataset:
        """Load a data file with :func:`load_records` and build the dataset, naming the file in errors."""
        return cls(load_records(path), source=str(path), **kwargs)

    def _render(self, record: Mapping[str, Any], number: int, tokenizer: Any,
                chat: bool | None) -> tuple[str, list[dict[str, Any]] | None]:
        """The prompt text the policy sees, and the chat messages it was rendered from (None without a chat)."""
        prompt = prompt_of(record, self.prompt_key, self.source, number)
        messages = prompt_messages(prompt, chat, self.source, number)
        if messages is None:
            text = prompt
        elif not getattr(tokenizer, "chat_template", None):
            raise DataFileError(
                f"{self.source}: record {number}: the prompt is a list of {{role, content}} messages, rendered with "
                "the chat template, but the tokenizer has none; set roles.actor.model.chat_template, use a chat "
                "model's tokenizer (roles.actor.model.tokenizer_path), or give text prompts"
            )
        else:
            tools = {"tools": self.chat_tools} if self.chat_tools else {}
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **tools)
        if not text:
            raise DataFileError(f"{self.source}: record {number}: the prompt is empty")
        return text, messages

    def _bound(self, index: int, record: Mapping[str, Any], text: str, ids: list[int], tokenizer: Any) -> PromptRow | None:
        """Apply the overlong policy; None means the record is skipped."""
        limit = self.max_prompt_length
        if not ids:
            raise DataFileError(f"{self.source}: record {index + 1}: the prompt encodes to no tokens")
        if limit is not None and len(ids) > limit:
            if self.overlong == "error":
                raise DataFileError(
                    f"{self.source}: record {index + 1}: prompt is {len(ids)} tokens, over "
                    f"max_prompt_length={limit}; raise the limit, or set overlong to 'truncate' or 'skip'"
                )
            if self.overlong == "skip":
                self.skipped += 1
                return None
            ids = ids[-limit:]
            text = tokenizer.decode(ids, skip_special_tokens=False)
            self.truncated += 1
        columns = reward_columns(record, self.prompt_key)
        return PromptRow(index=index, prompt_ids=tuple(int(i) for i in ids), prompt_text=text, columns=columns)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, position: int) -> PromptRow:  # type: ignore[override]
        return self._rows[position]


def prompt_of(record: Any, prompt_key: str, source: str, number: int) -> Any:
    """The record's prompt; DataFileError naming the record when it has none (run time and validate's sample)."""
    if not isinstance(record, Mapping):
        raise DataFileError(f"{source}: record {number}: expected a mapping, got {type(record).__name__}")
    if prompt_key not in record:
        columns = ", ".join(map(str, record)) or "none"
        raise DataFileError(
            f"{source}: record {number} has no {prompt_key!r} column (it has: {columns}); "
            "set data.prompt_key to the column holding the prompt"
        )
    return record[prompt_key]


def collate_prompts(
    rows: Sequence[PromptRow], tokenizer: Any = None, pad_token_id: int | None = None
) -> PromptBatch:
    """Left-pad rows into (input_ids, attention_mask) and gather columns (plus ``prompt_text``, and
    ``prompt_messages`` for rows rendered from a chat).

    Columns missing from some rows are filled with None. ``pad_token_id`` defaults to the
    tokenizer's pad id.
    """
    if not rows:
        raise ValueError("collate_prompts needs at least one row")
    if pad_token_id is None:
        pad_token_id = getattr(tokenizer, "pad_token_id", None)
    if pad_token_id is None:
        raise ValueError("collate_prompts needs a pad id: pass pad_token_id or a tokenizer with a pad token")
    width = max(len(row.prompt_ids) for row in rows)
    input_ids = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for position, row in enumerate(rows):
        length = len(row.prompt_ids)
        input_ids[position, width - length :] = torch.tensor(row.prompt_ids, dtype=torch.long)
        attention_mask[position, width - length :] = 1
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row.columns))
    columns: dict[str, list[Any]] = {name: [row.columns.get(name) for row in rows] for name in names}
    columns["prompt_text"] = [row.prompt_text for row in rows]
    if any(row.messages is not None for row in rows):
        columns["prompt_messages"] = [list(row.messages) if row.messages is not None else None for row in rows]
    return PromptBatch(input_ids, attention_mask, columns)
