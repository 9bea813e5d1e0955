"""Stage completion markers: ``<output_dir>/<stage>/COMPLETE``, written last, read to skip finished stages.

The marker holds the stage's recipe fingerprint (a hash of the resolved recipe), so a stage whose
recipe changed since is run again rather than skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlhfctl.pipeline.spec import COMPLETE_MARKER, MODEL_DIR

__all__ = ["clear_marker", "fingerprint", "is_complete", "read_marker", "write_marker"]


def fingerprint(cfg: DictConfig) -> str:
    """A short hash of the resolved recipe."""
    text = OmegaConf.to_yaml(cfg, resolve=True, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_marker(stage_dir: Path) -> dict[str, Any] | None:
    """The marker's contents, or None when there is no (readable) marker."""
    try:
        return json.loads((stage_dir / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_complete(stage_dir: Path, recipe_fingerprint: str) -> bool:
    """True when the stage finished with this very recipe and its model directory is still there."""
    marker = read_marker(stage_dir)
    return (
        marker is not None
        and marker.get("fingerprint") == recipe_fingerprint
        and (stage_dir / MODEL_DIR / "config.json").is_file()
    )


def write_marker(stage_dir: Path, info: dict[str, Any]) -> Path:
    """Write the marker atomically (a temporary file renamed into place); ``info`` must be JSON-able."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    target = stage_dir / COMPLETE_MARKER
    staging = stage_dir / f".{COMPLETE_MARKER}.tmp"
    staging.write_text(json.dumps({**info, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=1, default=str))
    os.replace(staging, target)
    return target


def clear_marker(stage_dir: Path) -> None:
    """Remove the marker before a stage runs, so an interrupted run never looks complete."""
    (stage_dir / COMPLETE_MARKER).unlink(missing_ok=True)
