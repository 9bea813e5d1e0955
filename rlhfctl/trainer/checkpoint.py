"""Atomic checkpoints: write to a temporary directory, rename, then move the ``latest`` pointer.

A save may finish later than it starts (the roles write their sharded state in the background):
:func:`start_checkpoint` writes into ``step_N.tmp`` and returns a :class:`PendingCheckpoint`, whose
``complete`` waits for the roles, renames and only then moves ``latest``. A crash before that leaves
``latest`` on the previous complete checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlhfctl.recipe.errors import RecipeError

LATEST = "latest"
STATE_FILE = "trainer_state.json"


def checkpoint_root(output_dir: str | Path) -> Path:
    """Where a run's checkpoints live."""
    return Path(output_dir) / "checkpoints"


@dataclass
class PendingCheckpoint:
    """A started checkpoint: ``complete`` waits for the roles' writes, renames ``step_N.tmp`` and moves ``latest``."""

    staging: Path
    final: Path
    wait_roles: Callable[[], None]
    keep_last: int = 0

    def complete(self) -> Path:
        """Wait for the roles, rename into place, point ``latest`` at it, prune; returns the checkpoint's path."""
        self.wait_roles()
        if self.final.exists():
            shutil.rmtree(self.final)
        os.replace(self.staging, self.final)
        root = self.final.parent
        pointer_tmp = root / f"{LATEST}.tmp"
        pointer_tmp.write_text(self.final.name)
        os.replace(pointer_tmp, root / LATEST)
        if self.keep_last > 0:
            prune_checkpoints(root, self.keep_last)
        return self.final


def start_checkpoint(output_dir: str | Path, step: int, driver_state: dict[str, Any], save_roles: Callable[[Path], None],
                     wait_roles: Callable[[], None] = lambda: None, keep_last: int = 0) -> PendingCheckpoint:
    """Start step ``step``: ``save_roles`` (which may leave writes running) and the driver state into ``step_N.tmp``."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f"step_{step}.tmp"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    save_roles(staging)
    (staging / STATE_FILE).write_text(json.dumps(driver_state, indent=1))
    return PendingCheckpoint(staging, root / f"step_{step}", wait_roles, keep_last)


def save_checkpoint(output_dir: str | Path, step: int, driver_state: dict[str, Any],
                    save_roles: Callable[[Path], None], keep_last: int = 0) -> Path:
    """Write step ``step`` atomically and wait: roles and driver state into ``step_N.tmp``, rename, update latest."""
    return start_checkpoint(output_dir, step, driver_state, save_roles, keep_last=keep_last).complete()


def prune_checkpoints(root: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` complete checkpoints (never the one ``latest`` names)."""
    latest = read_latest(root.parent)
    complete = sorted(
        (p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")),
        key=lambda p: int(p.name.split("_")[1]),
    )
    for old in complete[:-keep_last]:
        if latest is None or old.resolve() != latest.resolve():
            shutil.rmtree(old, ignore_errors=True)


def read_latest(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None; half-written ``.tmp`` directories are ignored."""
    root = checkpoint_root(output_dir)
    pointer = root / LATEST
    if pointer.exists():
        candidate = root / pointer.read_text().strip()
        if (candidate / STATE_FILE).exists():
            return candidate
    complete = [p for p in root.glob("step_*") if (p / STATE_FILE).exists() and not p.name.endswith(".tmp")]
    if not complete:
        return None
    return max(complete, key=lambda p: int(p.name.split("_")[1]))


def load_driver_state(checkpoint: Path) -> dict[str, Any]:
    """The driver's part of a checkpoint (step, data position, KL controller, RNG)."""
    return json.loads((checkpoint / STATE_FILE).read_text())


def resume_point(resume: str, output_dir: str | Path) -> Path | None:
    """The checkpoint ``trainer.resume`` asks for: none (never), the latest in output_dir (auto), or a path."""
    resume = str(resume)
    if resume == "never":
        return None
    if resume == "auto":
        return read_latest(output_dir)
    path = Path(resume)
    if not (path / STATE_FILE).exists():
        raise RecipeError(f"trainer.resume: {path} is not a checkpoint directory (it has no {STATE_FILE}); "
                          "use auto, never, or a checkpoints/step_N directory", key_path="trainer.resume")
    return path
