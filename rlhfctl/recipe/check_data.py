"""Validation: data files exist and have a supported type; task settings fit the batch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlhfctl.recipe.report import Issue, error, warning

__all__ = ["check_data"]

_CREATE_HINT = "create it (one JSON object per line with a prompt field) or point the recipe at an existing file"


def check_data(cfg: Any) -> list[Issue]:
    """Errors for missing or unsupported data files; warnings for settings that are ignored."""
    from rlhfctl.data.records import SAVED_DATASET_STATE, SUPPORTED_EXTENSIONS

    data = cfg.data
    issues = []
    for key in ("train_files", "val_files"):
        for index, name in enumerate(data.get(key) or []):
            path_key = f"data.{key}[{index}]"
            file = Path(os.path.expanduser(str(name)))
            if not file.exists():
                issues.append(error(path_key, f"{path_key}: data file not found: {name} (relative to {os.getcwd()}); {_CREATE_HINT}"))
            elif file.is_dir():
                if not (file / SAVED_DATASET_STATE).is_file():  # else a datasets save_to_disk directory
                    issues.append(error(path_key, (
                        f"{path_key}: {name} is a directory without {SAVED_DATASET_STATE}; give a data file "
                        "or a directory written by datasets' save_to_disk"
                    )))
            elif file.suffix.lower() not in SUPPORTED_EXTENSIONS:
                issues.append(error(path_key, (
                    f"{path_key}: unsupported file type {file.suffix or '(none)'!r} for {name}; "
                    f"use one of {', '.join(SUPPORTED_EXTENSIONS)}"
                )))
    if data.train_files and data.task:
        issues.append(warning("data.task", f"data.task: {data.task!r} is ignored because data.train_files is set"))
    if not data.train_files and data.task:
        issues.extend(_check_task(cfg))
    if cfg.trainer.val_every and not data.val_files and not data.task:
        issues.append(warning("trainer.val_every", "trainer.val_every: validation is on but there is no validation data (data.val_files)"))
    return issues


def _check_task(cfg: Any) -> list[Issue]:
    from rlhfctl.tasks import UnknownTaskError, get_task

    issues = []
    data = cfg.data
    if data.num_train < cfg.trainer.batch_size:
        issues.append(error("data.num_train", (
            f"data.num_train: {data.num_train} prompts is fewer than trainer.batch_size ({cfg.trainer.batch_size})"
        )))
    try:
        task = get_task(str(data.task))
    except UnknownTaskError as failure:
        return [*issues, error("data.task", f"data.task: {failure}")]
    reward = cfg.roles.get("reward")
    task_fn = f"{task.score.__module__}:{task.score.__name__}"
    if reward is not None and reward.get("function") and reward.function != task_fn and reward.get("model") is None:
        issues.append(warning("roles.reward.function", (
            f"roles.reward.function: {reward.function} scores the responses, not the {data.task!r} task's own reward {task_fn}"
        )))
    return issues
