"""Validation of the paths a recipe names: data files, local model directories, a resume checkpoint.

These checks need no torch, transformers or Ray, so ``validate`` and ``train`` run them right after the
recipe loads (:func:`path_errors`), before the heavy imports: a missing file is reported in about a
second. The full validation (``rlhfctl.recipe.validate``) runs the same functions again as part of its report.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlhfctl.data.records import SAVED_DATASET_STATE, SUPPORTED_EXTENSIONS
from rlhfctl.local_paths import looks_local
from rlhfctl.recipe.errors import Issue, error
from rlhfctl.recipe.resolve import present_roles

__all__ = ["data_file_issues", "model_path_issues", "path_errors", "resume_issues"]

_CREATE_HINT = "create it (one JSON object per line with a prompt field) or point the recipe at an existing file"


def data_file_issues(data: Any) -> list[Issue]:
    """Errors for ``data.train_files`` / ``data.val_files`` entries that are missing or of an unsupported kind."""
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
    return issues


def model_path_issues(role: str, model: Any) -> list[Issue]:
    """Errors for a role's local ``model.path`` / ``model.tokenizer_path`` that do not exist."""
    issues = []
    for field in ("path", "tokenizer_path"):
        value = model.get(field)
        if value and looks_local(str(value)) and not Path(os.path.expanduser(str(value))).exists():
            key = f"roles.{role}.model.{field}"
            issues.append(error(key, f"{key}: local path not found: {value}"))
    return issues


def resume_issues(cfg: Any) -> list[Issue]:
    """An error when trainer.resume names a checkpoint path that does not exist."""
    resume = str(cfg.trainer.resume)
    if resume in ("never", "auto") or Path(os.path.expanduser(resume)).exists():
        return []
    return [error("trainer.resume", f"trainer.resume: checkpoint not found: {resume} (use never, auto or an existing checkpoint path)")]


def path_errors(cfg: Any) -> list[Issue]:
    """Every path error of a loaded PPO-family or stage recipe, found without the heavy imports."""
    issues = data_file_issues(cfg.data) if cfg.get("data") is not None else []
    for role in present_roles(cfg):
        model = cfg.roles[role].get("model")
        if model is not None:
            issues += model_path_issues(role, model)
    if cfg.get("trainer") is not None and cfg.trainer.get("resume") is not None:
        issues += resume_issues(cfg)
    return issues
