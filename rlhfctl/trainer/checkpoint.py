"""Atomic checkpoints: write to a temporary directory, rename, then move the ``latest`` pointer.

A save may finish later than it starts (the roles write their sharded state in the background):
:func:`start_checkpoint` writes into ``step_N.tmp`` and returns a :class:`PendingCheckpoint`, whose
``complete`` waits for the roles, writes the manifest (``complete.json``: every file of the checkpoint
with its size), renames and only then moves ``latest``. A crash before that leaves ``latest`` on the
previous complete checkpoint. A checkpoint counts as complete only while every file its manifest lists
is there at its size, so one deleted halfway (by hand, or a crash while it was being replaced) is
passed over for the newest whole one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlhfctl.recipe.errors import RecipeError

LATEST = "latest"
STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "complete.json"
_STEP_DIR = re.compile(r"step_(\d+)")


def checkpoint_step(path: str | Path) -> int:
    """The step of a ``step_N`` checkpoint directory (its driver state's step for any other name)."""
    match = _STEP_DIR.fullmatch(Path(path).name)
    return int(match.group(1)) if match else int(load_driver_state(Path(path))["step"])


def write_manifest(directory: Path) -> None:
    """Mark ``directory`` complete: every file in it, with its size, listed in ``complete.json`` (written last)."""
    files = {str(path.relative_to(directory)): path.stat().st_size
             for path in sorted(directory.rglob("*")) if path.is_file() and path.name != MANIFEST_FILE}
    temporary = directory / f"{MANIFEST_FILE}.tmp"
    temporary.write_text(json.dumps({"files": files}, indent=0))
    os.replace(temporary, directory / MANIFEST_FILE)


def missing_parts(directory: Path) -> list[str]:
    """What keeps ``directory`` from being a complete checkpoint (empty: it is one).

    A checkpoint written before manifests existed (its driver state has no ``manifest`` key) needs only
    its driver state."""
    if not (directory / STATE_FILE).is_file():
        return [STATE_FILE]
    manifest = directory / MANIFEST_FILE
    if not manifest.is_file():
        try:
            legacy = "manifest" not in json.loads((directory / STATE_FILE).read_text())
        except ValueError:
            legacy = False
        return [] if legacy else [MANIFEST_FILE]
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError):
        return [MANIFEST_FILE]
    missing = []
    for name, size in files.items():
        path = directory / name
        if not path.is_file() or path.stat().st_size != size:
            missing.append(name)
    return missing


def is_complete(directory: Path) -> bool:
    """Whether ``directory`` is a whole checkpoint (see :func:`missing_parts`)."""
    return directory.is_dir() and not missing_parts(directory)


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
        write_manifest(self.staging)
        replaced = self.final.with_name(self.final.name + ".old")
        if self.final.exists():  # the same step saved again: moved aside at once, so no half of it stays a checkpoint
            if replaced.exists():
                shutil.rmtree(replaced)
            os.replace(self.final, replaced)
        os.replace(self.staging, self.final)
        shutil.rmtree(replaced, ignore_errors=True)
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
    (staging / STATE_FILE).write_text(json.dumps({**driver_state, "manifest": MANIFEST_FILE}, indent=1))
    return PendingCheckpoint(staging, root / f"step_{step}", wait_roles, keep_last)


def save_checkpoint(output_dir: str | Path, step: int, driver_state: dict[str, Any],
                    save_roles: Callable[[Path], None], keep_last: int = 0) -> Path:
    """Write step ``step`` atomically and wait: roles and driver state into ``step_N.tmp``, rename, update latest."""
    return start_checkpoint(output_dir, step, driver_state, save_roles, keep_last=keep_last).complete()


def prune_checkpoints(root: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` complete checkpoints (never the one ``latest`` names)."""
    latest = read_latest(root.parent)
    complete = sorted(_step_dirs(root), key=checkpoint_step)
    for old in complete[:-keep_last]:
        if latest is None or old.resolve() != latest.resolve():
            shutil.rmtree(old, ignore_errors=True)


def read_latest(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None: the one ``latest`` names while it is whole, else the
    newest whole ``step_N``; half-written ``.tmp`` directories and checkpoints missing a file are passed over."""
    root = checkpoint_root(output_dir)
    pointer = root / LATEST
    if pointer.exists():
        candidate = root / pointer.read_text().strip()
        if is_complete(candidate):
            return candidate
    complete = [p for p in _step_dirs(root) if is_complete(p)]
    if not complete:
        return None
    return max(complete, key=checkpoint_step)


def _step_dirs(root: Path) -> list[Path]:
    """The ``step_N`` directories under ``root`` (not ``step_N.tmp`` being written, nor ``step_N.old`` being replaced)."""
    return [p for p in root.glob("step_*") if p.is_dir() and _STEP_DIR.fullmatch(p.name)]


def load_driver_state(checkpoint: Path) -> dict[str, Any]:
    """The driver's part of a checkpoint (step, data position, KL controller, RNG), as the trainer gave it."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    state.pop("manifest", None)  # the mark that the checkpoint has a manifest (see missing_parts)
    return state


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
    missing = missing_parts(path)
    if missing:
        raise RecipeError(f"trainer.resume: {path} is not a complete checkpoint (missing or cut short: "
                          f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}); use auto for the newest "
                          "complete one, or another checkpoints/step_N directory", key_path="trainer.resume")
    return path
