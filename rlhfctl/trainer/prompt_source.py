"""Prompts for training and validation, from the recipe's data files or a bundled task, as DataProtos.

Files in verl's layout train as they are: the chat template and the ``ground_truth`` lift follow
:mod:`rlhfctl.data.verl_layout`, and every other column (``data_source``, ``reward_model``, ``extra_info``, ...)
becomes a non-tensor column with one value per sample (a dict stays a dict, a list a list).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from rlhfctl.recipe.specs import Recipe

from rlhfctl.agents.tool_registry import chat_tools
from rlhfctl.data import PromptBatcher, PromptDataset, collate_prompts, load_records
from rlhfctl.protocol import DataProto
from rlhfctl.tasks import data_task


VAL_SEED_OFFSET = 1_000_003
"""A task's validation prompts are generated with ``trainer.seed`` plus this, its training prompts with ``trainer.seed``."""


def task_split(recipe: Recipe, split: str) -> tuple[int, int]:
    """(count, seed) of a task's ``split`` (train or val): ``data.num_train`` / ``data.num_val`` prompts, and a
    seed of their own for validation, so its prompts are other draws than the training prompts."""
    if split == "train":
        return int(recipe.data.num_train), int(recipe.trainer.seed)
    return int(recipe.data.num_val), int(recipe.trainer.seed) + VAL_SEED_OFFSET


def _records(recipe: Recipe, split: str) -> tuple[list[dict[str, Any]], str] | None:
    files = recipe.data.train_files if split == "train" else recipe.data.val_files
    if files:
        files = [files] if isinstance(files, str) else list(files)
        return [record for path in files for record in load_records(path)], ", ".join(map(str, files))
    task = data_task(recipe.data)  # data.tasks' mixture, or data.task
    if task is not None:
        count, seed = task_split(recipe, split)
        return task.make_prompts(count, seed), f"task '{task.name}' ({split})"
    return None


def source_records(recipe: Recipe, split: str) -> list[dict[str, Any]] | None:
    """The raw records of ``split`` (train or val) before tokenizing, or None when the recipe has none."""
    found = _records(recipe, split)
    return None if found is None else found[0]


def build_dataset(recipe: Recipe, tokenizer: Any, split: str) -> PromptDataset | None:
    """The prompts of ``split`` (train or val), or None when the recipe has none for it."""
    found = _records(recipe, split)
    if found is None:
        return None
    records, source = found
    return PromptDataset(
        records,
        prompt_key=recipe.data.prompt_key,
        tokenizer=tokenizer,
        max_prompt_length=recipe.data.max_prompt_length,
        overlong=recipe.data.overlong,
        apply_chat_template=recipe.data.apply_chat_template,
        source=source,
        chat_tools=chat_tools(recipe.rollout.multi_turn),
    )


_uid_counter = itertools.count()


def to_dataproto(rows: list, tokenizer: Any) -> DataProto:
    """Collate rows into a DataProto: left-padded prompts, a ``uid`` per prompt, and the reward columns."""
    collated = collate_prompts(rows, tokenizer)
    non_tensors = {name: values for name, values in collated.columns.items()}
    non_tensors["uid"] = np.array([f"p{next(_uid_counter)}" for _ in rows], dtype=object)
    return DataProto.from_dict(
        tensors={"input_ids": collated.input_ids, "attention_mask": collated.attention_mask},
        non_tensors=non_tensors,
    )


def make_batcher(dataset: PromptDataset, recipe: Recipe) -> PromptBatcher:
    """Endless, resumable batches of ``trainer.batch_size`` prompts."""
    return PromptBatcher(dataset, recipe.trainer.batch_size, seed=recipe.trainer.seed, shuffle=recipe.data.shuffle)
