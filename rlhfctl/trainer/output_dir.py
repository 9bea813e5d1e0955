"""One run per output_dir: a new run never mixes its metrics and checkpoints with a previous run's.

A second ``train`` into a directory that holds a run, with ``trainer.resume: never``, would truncate the
old ``metrics.jsonl`` and leave ``checkpoints/latest`` pointing at the old run's step, so a later
``resume=auto`` would load the other run. :func:`prepare_output_dir` stops that before anything starts,
unless ``trainer.overwrite`` asks to clear the run's files first.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.specs import Recipe
from rlhfctl.recipe.stages import MODEL_DIR
from rlhfctl.trainer import checkpoint

__all__ = ["RUN_ENTRIES", "check_output_dir", "holds_previous_run", "prepare_output_dir"]

#: What a run writes into its output_dir; ``trainer.overwrite`` removes exactly these and nothing else.
RUN_ENTRIES: tuple[str, ...] = ("metrics.jsonl", "samples.jsonl", "trace.json", "workers.json", "recipe.yaml",
                                "checkpoints", "tensorboard", "wandb", "mlruns", MODEL_DIR)


def holds_previous_run(output_dir: Path) -> bool:
    """Whether ``output_dir`` holds a run's steps or checkpoints."""
    metrics = output_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        return True
    root = checkpoint.checkpoint_root(output_dir)
    return root.is_dir() and any(root.glob("step_*"))


def check_output_dir(recipe: Recipe) -> bool:
    """Refuse (RecipeError, exit 2) a fresh run into a used output_dir; True when ``trainer.overwrite`` will clear it.

    Touches nothing, so a command can call it before it prints anything."""
    trainer = recipe.trainer
    output_dir = Path(trainer.output_dir)
    if str(trainer.resume) != "never" or not holds_previous_run(output_dir):
        return False
    if trainer.overwrite:
        return True
    raise RecipeError(
        f"trainer.output_dir: {output_dir} already holds a run (metrics.jsonl or checkpoints); "
        "continue it with trainer.resume=auto, pick another trainer.output_dir, "
        "or pass trainer.overwrite=true to clear it first",
        key_path="trainer.output_dir",
    )


def prepare_output_dir(recipe: Recipe) -> None:
    """Refuse a fresh run into a used output_dir (:func:`check_output_dir`); clear it first with ``trainer.overwrite``."""
    if not check_output_dir(recipe):
        return
    output_dir = Path(recipe.trainer.output_dir)
    for name in RUN_ENTRIES:
        entry = output_dir / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()
