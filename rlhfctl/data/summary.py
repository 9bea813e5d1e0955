"""What validate read of a data file: its rows, columns, prompt form, and where the ground truth comes from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rlhfctl.data.verl_layout import (
    GROUND_TRUTH,
    ground_truth_key,
    reward_columns,
    uses_chat_template,
)

__all__ = ["DataFileSummary", "summarize_sample"]


@dataclass(frozen=True)
class DataFileSummary:
    """One data file as validate sampled it (see :func:`summarize_sample`)."""

    key: str
    """The recipe key naming the file, e.g. ``data.train_files[0]``."""
    path: str
    rows: int | None
    """Records in the whole file (parquet metadata, line count), None when they cannot be counted cheaply."""
    sampled: int
    """Records read from the start of the file."""
    columns: tuple[str, ...]
    """Every column of the sampled records, the prompt's included, in the order first seen."""
    prompt_forms: tuple[str, ...]
    """``text`` and/or ``messages``: what the sampled prompts are."""
    chat_template: bool
    """Whether the sampled prompts are rendered with the chat template (any of them)."""
    ground_truth_keys: tuple[str, ...]
    """``ground_truth`` and/or ``reward_model.ground_truth``; empty when no sampled record has either."""
    ground_truth_rows: int
    """Sampled records whose ground truth is not null."""

    @property
    def prompt(self) -> str:
        """The prompt form and its rendering, e.g. ``messages -> chat template`` or ``text``."""
        forms = ", ".join(self.prompt_forms) or "-"
        return f"{forms} -> chat template" if self.chat_template else forms

    @property
    def ground_truth(self) -> str | None:
        """The key(s) the ground truth comes from, or None."""
        return ", ".join(self.ground_truth_keys) or None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view, with the rendered ``prompt`` and ``ground_truth`` beside the fields."""
        return {**asdict(self), "columns": list(self.columns), "prompt_forms": list(self.prompt_forms),
                "ground_truth_keys": list(self.ground_truth_keys), "prompt": self.prompt,
                "ground_truth": self.ground_truth}


def summarize_sample(key: str, path: str, records: Sequence[Mapping[str, Any]], prompt_key: str,
                     apply_chat_template: bool | None, rows: int | None) -> DataFileSummary:
    """Summarize records already read (and checked) from the start of a file, by the run's own layout rules."""
    columns: dict[str, None] = {}
    forms: dict[str, None] = {}
    sources: dict[str, None] = {}
    chat, present = False, 0
    for record in records:
        columns.update(dict.fromkeys(str(column) for column in record))
        prompt = record.get(prompt_key)
        forms[_form(prompt)] = None
        chat = chat or uses_chat_template(apply_chat_template, prompt)
        source = ground_truth_key(record)
        if source is not None:
            sources[source] = None
        present += reward_columns(record, prompt_key).get(GROUND_TRUTH) is not None
    return DataFileSummary(key=key, path=path, rows=rows, sampled=len(records), columns=tuple(columns),
                           prompt_forms=tuple(forms), chat_template=chat, ground_truth_keys=tuple(sources),
                           ground_truth_rows=present)


def _form(prompt: Any) -> str:
    if isinstance(prompt, str):
        return "text"
    return "messages" if isinstance(prompt, (list, tuple)) else type(prompt).__name__
