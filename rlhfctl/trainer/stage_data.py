"""Records for the supervised stages: from data files (with an optional held-out share) or a bundled task.

``stage_records(recipe, kind)`` returns the training and evaluation records of ``kind``
(``"demonstrations"`` for sft, ``"preferences"`` for reward_model and dpo):

- with ``data.train_files``: their records; evaluation from ``data.val_files``, else a seeded random
  ``data.eval_fraction`` of the training records (none when 0);
- with ``data.task``: ``data.num_train`` generated records, and ``data.num_val`` generated from another
  seed for evaluation (none when 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from rlhfctl.recipe.specs import Recipe

from rlhfctl.data.errors import DataConfigError
from rlhfctl.data.pairs import PreferenceDataset
from rlhfctl.data.records import load_records
from rlhfctl.tasks import get_task, task_names

__all__ = ["StageRecords", "preference_dataset", "stage_records"]

_VAL_SEED_OFFSET = 1_000_003
_GENERATORS = {"demonstrations": "make_demonstrations", "preferences": "make_preferences"}


@dataclass
class StageRecords:
    """Training and (optional) evaluation records, with where they came from for error messages."""

    train: list[dict[str, Any]]
    train_source: str
    eval: list[dict[str, Any]] | None
    eval_source: str


def _files(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(item) for item in value]


def _from_files(recipe: Recipe) -> StageRecords:
    files = _files(recipe.data.train_files)
    records = [record for path in files for record in load_records(path)]
    source = ", ".join(files)
    if recipe.data.val_files:
        val_files = _files(recipe.data.val_files)
        held_out = [record for path in val_files for record in load_records(path)]
        return StageRecords(records, source, held_out, ", ".join(val_files))
    fraction = float(recipe.data.eval_fraction or 0.0)
    if fraction <= 0:
        return StageRecords(records, source, None, "")
    count = max(1, math.floor(len(records) * fraction))
    if count >= len(records):
        raise DataConfigError(
            f"data.eval_fraction={fraction} of the {len(records)} records in {source} leaves none to train on; "
            "lower it or add records"
        )
    order = np.random.default_rng([int(recipe.trainer.seed), 7]).permutation(len(records))
    held = set(order[:count].tolist())
    train = [record for index, record in enumerate(records) if index not in held]
    held_out = [records[index] for index in sorted(held)]
    return StageRecords(train, source, held_out, f"{source} (held-out {fraction:g})")


def _from_task(recipe: Recipe, kind: str) -> StageRecords:
    name = str(recipe.data.task)
    task = get_task(name)
    generate = getattr(task, _GENERATORS[kind], None)
    if generate is None:
        offering = [other for other in task_names() if getattr(get_task(other), _GENERATORS[kind], None) is not None]
        raise DataConfigError(
            f"data.task: the {name!r} task has no {kind} for algorithm.name={recipe.algorithm.name}; "
            f"tasks that have them: {', '.join(offering) or 'none'} (or set data.train_files)"
        )
    seed = int(recipe.trainer.seed)
    train = generate(int(recipe.data.num_train), seed)
    held_out = generate(int(recipe.data.num_val), seed + _VAL_SEED_OFFSET) if int(recipe.data.num_val) > 0 else None
    return StageRecords(train, f"task '{name}' ({kind}, train)", held_out, f"task '{name}' ({kind}, val)")


def stage_records(recipe: Recipe, kind: str) -> StageRecords:
    """The records of ``kind`` ("demonstrations" or "preferences") the recipe's data section names."""
    if kind not in _GENERATORS:
        raise ValueError(f"kind must be one of {', '.join(_GENERATORS)}, got {kind!r}")
    if recipe.data.train_files:
        return _from_files(recipe)
    if recipe.data.task:
        return _from_task(recipe, kind)
    raise DataConfigError(f"data.train_files: set data files with {kind} (or data.task for a bundled task)")


def preference_dataset(recipe: Recipe, tokenizer: Any, records: list[dict[str, Any]], source: str) -> PreferenceDataset:
    """Tokenize preference pairs with the recipe's data keys and length limit (reward_model and dpo)."""
    return PreferenceDataset.from_data_section(records, tokenizer, recipe.data, source)
