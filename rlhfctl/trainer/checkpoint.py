"""Atomic checkpoints: write to a temporary directory, rename, then move the ``latest`` pointer."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from rlhfctl.recipe.errors import RecipeError

LATEST = "latest"
STATE_FILE = "trainer_state.json"


def checkpoint_root(output_dir: str | Path) -> Path:
    """Where a run's checkpoints live."""
    return Path(output_dir) / "checkpoints"


def save_checkpoint(output_dir: str | Path, step: int, driver_state: dict[str, Any],
                    save_roles: Callable[[Path], None], keep_last: int = 0) -> Path:
    """Write step ``step`` atomically: roles and driver state into ``step_N.tmp``, rename, update latest."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    staging = root / f"step_{step}.tmp"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    save_roles(staging)
    (staging / STATE_FILE).write_text(json.dumps(driver_state, indent=1))
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    pointer_tmp = root / f"{LATEST}.tmp"
    pointer_tmp.write_text(final.name)
    os.replace(pointer_tmp, root / LATEST)
    if keep_last > 0:
        prune_checkpoints(root, keep_last)
    return final


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
