"""Datasets for the supervised stages: demonstrations (sft) and preference pairs (reward_model, dpo).

A **demonstration** record is ``{"prompt": ..., "response": ...}`` (column names configurable), or a
chat ``{"messages": [{"role": ..., "content": ...}, ...]}`` (with an optional ``tools`` column of
function schemas for the template) that ends with an assistant message. A prompt/response record is
learned on its response tokens, which end with the end-of-sequence token (a text prompt gets the chat
template only when ``apply_chat_template`` says so). A chat is learned on **every assistant turn**
(content and ``tool_calls``, through its end-of-sequence token) while system, user and tool turns and
the role headers are context (:mod:`rlhfctl.data.chat_masks` has the rule); a chat with one assistant
reply gives the same tokens as a prompt rendered with the chat template and that reply as response.

A **preference** record is ``{"prompt": ..., "chosen": ..., "rejected": ...}``. Each pair keeps the
token ids a policy needs (prompt, and each response plus end-of-sequence: dpo) and the ids a reward
model scores (the text ``prompt + response`` tokenized as one string, as ``workers.reward`` scores
rollouts).

Examples longer than ``max_length`` tokens follow ``overlong``: ``error`` (default), ``truncate``
(keep the end of the prompt and the start of the response; the prompt keeps at most half of
``max_length`` when both do not fit) or ``skip``. A chat's prompt is what precedes its first assistant
turn and its response all the rest, so a truncated chat keeps its first turns: one cut inside an
assistant turn keeps that turn's first tokens as labels (without its end-of-sequence token) and drops
what follows, one cut inside a context turn drops that turn's kept part too (no label follows it).
Every problem is a :class:`DataFileError` naming the source and the 1-based record number.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar

import torch

from rlhfctl.data.chat_masks import ChatLayout, ChatLayoutError, check_chat
from rlhfctl.data.errors import DataConfigError, DataFileError
from rlhfctl.data.verl_layout import uses_chat_template

__all__ = [
    "Demonstration",
    "DemonstrationDataset",
    "PreferenceDataset",
    "PreferencePair",
    "collate_demonstrations",
    "collate_policy_pairs",
    "collate_reward_pairs",
    "fit_example",
    "left_padded",
]

_OVERLONG = ("error", "truncate", "skip")
_TOOLS_KEY = "tools"
"""A chat record's column of OpenAI function schemas, passed to the chat template as ``tools``."""


@dataclass(frozen=True)
class Demonstration:
    """One tokenized demonstration: the prompt (context), then the response with its mask of learned tokens.

    The layout of an agent trajectory (``rlhfctl.agents.trajectory``): a prompt/response record's mask is
    all 1; a chat's response holds every turn after the first assistant turn began, 1 on the assistant
    turns' labels and 0 on the context between them.
    """

    index: int
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...] | None = None
    """1 where the loss is taken; None: every response token."""

    def __post_init__(self) -> None:
        mask = (1,) * len(self.response_ids) if self.response_mask is None else tuple(self.response_mask)
        if len(mask) != len(self.response_ids):
            raise ValueError(f"response_mask has {len(mask)} entries for {len(self.response_ids)} response tokens")
        object.__setattr__(self, "response_mask", mask)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def input_ids(self) -> tuple[int, ...]:
        """The whole sequence, prompt then response."""
        return self.prompt_ids + self.response_ids

    @property
    def loss_mask(self) -> tuple[int, ...]:
        """One entry per token of :attr:`input_ids`: 0 on the prompt, the response mask after it."""
        return (0,) * len(self.prompt_ids) + tuple(self.response_mask or ())


@dataclass(frozen=True)
class PreferencePair:
    """One tokenized preference pair, for a policy (dpo) and for a reward model."""

    index: int
    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    """The chosen response, ending with end-of-sequence (a policy's view)."""
    rejected_ids: tuple[int, ...]
    chosen_sequence_ids: tuple[int, ...]
    """``prompt + chosen`` tokenized as one text, no end-of-sequence (what a reward model scores)."""
    rejected_sequence_ids: tuple[int, ...]


def fit_example(prompt: list[int], response: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """Cut a prompt (keeping its end) and a response (keeping its start) to ``max_length`` tokens together."""
    if len(prompt) + len(response) <= max_length:
        return prompt, response
    keep_prompt = min(len(prompt), max(max_length - len(response), max_length // 2))
    return prompt[len(prompt) - keep_prompt :], response[: max_length - keep_prompt]


class _RecordReader:
    """Shared checks and tokenization of one source's records."""

    def __init__(self, tokenizer: Any, max_length: int, overlong: str, apply_chat_template: bool | None,
                 source: str) -> None:
        if tokenizer is None:
            raise TypeError("the dataset needs a tokenizer (tokenizer=...)")
        if overlong not in _OVERLONG:
            raise DataConfigError(f"unknown overlong policy {overlong!r}; use one of {', '.join(_OVERLONG)}")
        if max_length < 2:
            raise DataConfigError(f"data.max_length must be at least 2 tokens, got {max_length}")
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.overlong = overlong
        self.apply_chat_template = apply_chat_template
        self.source = source
        self.skipped = 0
        self.truncated = 0
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise DataConfigError(f"{source}: the tokenizer has no end-of-sequence token; responses must end with one")
        self.eos = int(eos)

    def fail(self, number: int, message: str) -> DataFileError:
        return DataFileError(f"{self.source}: record {number}: {message}")

    def text(self, record: Mapping[str, Any], key: str, number: int, what: str, setting: str) -> str:
        if key not in record:
            columns = ", ".join(map(str, record)) or "none"
            raise self.fail(number, f"no {key!r} column for the {what} (it has: {columns}); set {setting}")
        value = record[key]
        if not isinstance(value, str):
            raise self.fail(number, f"the {what} ({key!r}) must be a string, got {type(value).__name__}")
        if not value:
            raise self.fail(number, f"the {what} ({key!r}) is empty")
        return value

    def render_prompt(self, prompt: Any, number: int) -> str:
        if not uses_chat_template(self.apply_chat_template, prompt):
            return prompt
        return self.chat([{"role": "user", "content": prompt}], number)

    def require_chat_template(self, number: int) -> None:
        if not getattr(self.tokenizer, "chat_template", None):
            raise DataConfigError(
                f"{self.source}: record {number} needs a chat template but the tokenizer has none; set model.chat_template or use a chat model's tokenizer (model.tokenizer_path)"
            )

    def chat(self, messages: list[Mapping[str, Any]], number: int) -> str:
        self.require_chat_template(number)
        return self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)

    def encode(self, text: str) -> list[int]:
        return [int(token) for token in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def bound(self, prompt: list[int], response: list[int], number: int,
              what: str = "prompt + response is") -> tuple[list[int], list[int]] | None:
        """Apply the overlong policy to one (prompt, response); None means skip the record."""
        total = len(prompt) + len(response)
        if total <= self.max_length:
            return prompt, response
        if self.overlong == "error":
            raise self.fail(number, (
                f"{what} {total} tokens, over data.max_length={self.max_length}; raise it, or set "
                "data.overlong to truncate or skip"
            ))
        if self.overlong == "skip":
            self.skipped += 1
            return None
        self.truncated += 1
        return fit_example(prompt, response, self.max_length)


def _check_mapping(record: Any, source: str, number: int) -> Mapping[str, Any]:
    if not isinstance(record, Mapping):
        raise DataFileError(f"{source}: record {number}: expected a mapping, got {type(record).__name__}")
    return record


def _none_left(rows: list[Any], records: list[Any], source: str, max_length: int) -> None:
    if records and not rows:
        raise DataFileError(
            f"{source}: all {len(records)} records are longer than data.max_length={max_length} tokens and were "
            "skipped; raise data.max_length or set data.overlong to truncate"
        )


RowT = TypeVar("RowT")


class _RecordDataset(Sequence[RowT]):
    """Records checked and tokenized one at a time by the subclass's ``_row`` (None: skipped as overlong).

    ``key_names`` are the subclass's column-key arguments, named as the recipe's ``data.*`` keys are, so
    :meth:`from_data_section` reads them from there.
    """

    key_names: tuple[str, ...] = ()

    def __init__(self, records: Iterable[Any], tokenizer: Any, *, max_length: int = 128, overlong: str = "error",
                 apply_chat_template: bool | None = False, source: str = "<records>") -> None:
        reader = _RecordReader(tokenizer, max_length, overlong, apply_chat_template, source)
        self.source = source
        records = list(records)
        self._rows: list[RowT] = []
        for index, record in enumerate(records):
            row = self._row(reader, index, _check_mapping(record, source, index + 1))
            if row is not None:
                self._rows.append(row)
        _none_left(self._rows, records, source, max_length)
        self.skipped, self.truncated = reader.skipped, reader.truncated

    @classmethod
    def from_data_section(cls, records: Iterable[Any], tokenizer: Any, data: Mapping[str, Any], source: str) -> Self:
        """Tokenize with a recipe's ``data`` section: its column keys, length limit, overlong policy and chat template."""
        keys = {name: data[name] for name in cls.key_names}
        return cls(records, tokenizer, max_length=data["max_length"], overlong=data["overlong"],
                   apply_chat_template=data["apply_chat_template"], source=source, **keys)

    def _row(self, reader: _RecordReader, index: int, record: Mapping[str, Any]) -> RowT | None:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, position: int) -> RowT:  # type: ignore[override]
        return self._rows[position]


class DemonstrationDataset(_RecordDataset[Demonstration]):
    """Tokenized demonstrations for sft (see the module doc for the record formats)."""

    key_names = ("prompt_key", "response_key", "messages_key")

    def __init__(self, records: Iterable[Mapping[str, Any]], tokenizer: Any, *, prompt_key: str = "prompt",
                 response_key: str = "response", messages_key: str = "messages", **reading: Any) -> None:
        self.keys = (prompt_key, response_key, messages_key)
        self._chat_layout: ChatLayout | None = None
        super().__init__(records, tokenizer, **reading)

    def _row(self, reader: _RecordReader, index: int, record: Mapping[str, Any]) -> Demonstration | None:
        number = index + 1
        prompt_key, response_key, messages_key = self.keys
        if messages_key in record and prompt_key not in record:
            return self._chat_row(reader, index, record)
        prompt = reader.text(record, prompt_key, number, "prompt", f"data.prompt_key (or give a {messages_key!r} chat)")
        response = reader.text(record, response_key, number, "response", "data.response_key")
        prompt_ids = reader.encode(reader.render_prompt(prompt, number))
        bounded = reader.bound(prompt_ids, reader.encode(response) + [reader.eos], number)
        return None if bounded is None else Demonstration(index, tuple(bounded[0]), tuple(bounded[1]))

    def _chat_row(self, reader: _RecordReader, index: int, record: Mapping[str, Any]) -> Demonstration | None:
        number = index + 1
        messages, tools = record[self.keys[2]], record.get(_TOOLS_KEY)
        try:
            check_chat(messages)
            if tools is not None and not isinstance(tools, (list, tuple)):
                raise ChatLayoutError(f"the {_TOOLS_KEY!r} column must be a list of function schemas, got {type(tools).__name__}")
            reader.require_chat_template(number)
            chat = self._layout(reader).tokens(messages, tools)
        except ChatLayoutError as error:
            raise reader.fail(number, str(error)) from error
        response, mask = chat.response_ids, chat.response_mask
        bounded = reader.bound(chat.prompt_ids, response, number, "the chat is")
        if bounded is None:
            return None
        kept = mask[: len(bounded[1])]
        while not kept[-1]:  # cut inside a context turn: drop its kept part (the first turn's start always stays)
            kept = kept[:-1]
        return Demonstration(index, tuple(bounded[0]), tuple(bounded[1][: len(kept)]), tuple(kept))

    def _layout(self, reader: _RecordReader) -> ChatLayout:
        if self._chat_layout is None:
            self._chat_layout = ChatLayout(reader.tokenizer, reader.encode, reader.eos)
        return self._chat_layout


class PreferenceDataset(_RecordDataset[PreferencePair]):
    """Tokenized preference pairs for reward_model and dpo (see the module doc)."""

    key_names = ("prompt_key", "chosen_key", "rejected_key")

    def __init__(self, records: Iterable[Mapping[str, Any]], tokenizer: Any, *, prompt_key: str = "prompt",
                 chosen_key: str = "chosen", rejected_key: str = "rejected", **reading: Any) -> None:
        self.keys = (prompt_key, chosen_key, rejected_key)
        super().__init__(records, tokenizer, **reading)

    def _row(self, reader: _RecordReader, index: int, record: Mapping[str, Any]) -> PreferencePair | None:
        number = index + 1
        prompt_key, chosen_key, rejected_key = self.keys
        prompt = reader.render_prompt(reader.text(record, prompt_key, number, "prompt", "data.prompt_key"), number)
        chosen = reader.text(record, chosen_key, number, "chosen response", "data.chosen_key")
        rejected = reader.text(record, rejected_key, number, "rejected response", "data.rejected_key")
        return self._pair(reader, index, prompt, chosen, rejected)

    @staticmethod
    def _pair(reader: _RecordReader, index: int, prompt: str, chosen: str, rejected: str) -> PreferencePair | None:
        number = index + 1
        prompt_ids = reader.encode(prompt)
        longest = max((reader.encode(chosen), reader.encode(rejected)), key=len)
        bounded = reader.bound(prompt_ids, longest + [reader.eos], number)
        if bounded is None:
            return None
        kept_prompt = bounded[0]
        room = reader.max_length - len(kept_prompt)
        chosen_ids = (reader.encode(chosen) + [reader.eos])[:room]
        rejected_ids = (reader.encode(rejected) + [reader.eos])[:room]
        # The reward model reads one text; keep its end (where the score is read) within max_length.
        chosen_sequence = reader.encode(prompt + chosen)[-reader.max_length :]
        rejected_sequence = reader.encode(prompt + rejected)[-reader.max_length :]
        return PreferencePair(
            index,
            tuple(kept_prompt),
            tuple(chosen_ids),
            tuple(rejected_ids),
            tuple(chosen_sequence),
            tuple(rejected_sequence),
        )


# --------------------------------------------------------------------------- collation


def _right_padded(sequences: Sequence[Sequence[int]], pad_token_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(sequence) for sequence in sequences) if width is None else width
    ids = torch.full((len(sequences), width), int(pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        mask[row, : len(sequence)] = 1
    return ids, mask


def left_padded(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows left-padded to the longest: ``input_ids`` and ``attention_mask`` (prompts, partial rollouts' prefixes)."""
    width = max(len(sequence) for sequence in sequences)
    ids = torch.full((len(sequences), width), int(pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        if sequence:
            ids[row, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
            mask[row, width - len(sequence) :] = 1
    return ids, mask


def _pack(rows: Sequence[Demonstration], max_length: int) -> list[list[Demonstration]]:
    """First-fit packing of demonstrations, in order, into bins of ``max_length`` tokens."""
    bins: list[list[Demonstration]] = []
    room: list[int] = []
    for row in rows:
        for position, free in enumerate(room):
            if len(row) <= free:
                bins[position].append(row)
                room[position] -= len(row)
                break
        else:
            bins.append([row])
            room.append(max_length - len(row))
    return bins


def collate_demonstrations(
    rows: Sequence[Demonstration], pad_token_id: int, *, packing: bool = False, max_length: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask``, ``position_ids`` and ``loss_mask`` (each row's
    :attr:`Demonstration.loss_mask`: 1 on the learned response tokens).

    With ``packing``, demonstrations share rows of at most ``max_length`` tokens; ``position_ids``
    restart at 0 for each one (so attention can be kept within each demonstration) and the padding at
    the end of a row continues the last one's positions.
    """
    if not rows:
        raise ValueError("collate_demonstrations needs at least one demonstration")
    if packing and not max_length:
        raise ValueError("packing needs max_length (data.max_length)")
    groups = _pack(rows, int(max_length)) if packing else [[row] for row in rows]
    width = max(sum(len(row) for row in group) for group in groups)
    ids = torch.full((len(groups), width), int(pad_token_id), dtype=torch.long)
    attention = torch.zeros((len(groups), width), dtype=torch.long)
    positions = torch.zeros((len(groups), width), dtype=torch.long)
    loss_mask = torch.zeros((len(groups), width), dtype=torch.long)
    for line, group in enumerate(groups):
        start = 0
        for row in group:
            end = start + len(row)
            ids[line, start:end] = torch.tensor(row.input_ids, dtype=torch.long)
            attention[line, start:end] = 1
            positions[line, start:end] = torch.arange(len(row))
            loss_mask[line, start:end] = torch.tensor(row.loss_mask, dtype=torch.long)
            start = end
        last = len(group[-1])
        positions[line, start:] = torch.arange(last, last + width - start)
    return {"input_ids": ids, "attention_mask": attention, "position_ids": positions, "loss_mask": loss_mask}


def collate_reward_pairs(rows: Sequence[PreferencePair], pad_token_id: int) -> dict[str, torch.Tensor]:
    """``chosen_input_ids`` / ``rejected_input_ids`` and their attention masks, right-padded to one width."""
    if not rows:
        raise ValueError("collate_reward_pairs needs at least one pair")
    width = max(max(len(row.chosen_sequence_ids), len(row.rejected_sequence_ids)) for row in rows)
    chosen_ids, chosen_mask = _right_padded([row.chosen_sequence_ids for row in rows], pad_token_id, width)
    rejected_ids, rejected_mask = _right_padded([row.rejected_sequence_ids for row in rows], pad_token_id, width)
    return {
        "chosen_input_ids": chosen_ids,
        "chosen_attention_mask": chosen_mask,
        "rejected_input_ids": rejected_ids,
        "rejected_attention_mask": rejected_mask,
    }


def collate_policy_pairs(rows: Sequence[PreferencePair], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Both responses in the rollout layout: left-padded prompt then right-padded response, one width.

    Keys per side (``chosen_`` / ``rejected_``): ``input_ids``, ``attention_mask``, ``responses``,
    ``response_mask``; the prompt part is shared.
    """
    if not rows:
        raise ValueError("collate_policy_pairs needs at least one pair")
    prompts, prompt_mask = left_padded([row.prompt_ids for row in rows], pad_token_id)
    width = max(max(len(row.chosen_ids), len(row.rejected_ids)) for row in rows)
    out: dict[str, torch.Tensor] = {}
    for side in ("chosen", "rejected"):
        responses, response_mask = _right_padded([getattr(row, f"{side}_ids") for row in rows], pad_token_id, width)
        out[f"{side}_input_ids"] = torch.cat([prompts, responses], dim=1)
        out[f"{side}_attention_mask"] = torch.cat([prompt_mask, response_mask], dim=1)
        out[f"{side}_responses"] = responses
        out[f"{side}_response_mask"] = response_mask
    return out
