"""Warnings about restarts after a lost worker (``trainer.max_restarts``) that would not do what a user expects.

- ``max_restarts > 0`` without ``save_every``: no checkpoint is ever written before the last step, so
  every restart starts the run again from step 0.
- ``call_timeout_s`` shorter than a step this recipe is known to take: every call of a step is shorter
  than the step, but a timeout under the measured step is close enough to cut a healthy call, which a
  restart would then redo for nothing. A step's time is known when the run resumes (``trainer.resume``
  is not ``never``) in an output_dir whose ``metrics.jsonl`` holds ``time/step``: the longest one there.
"""

from __future__ import annotations

import json
from pathlib import Path
from rlhfctl.recipe.errors import Issue, warning
from rlhfctl.recipe.specs import Recipe

__all__ = ["check_restarts", "measured_step_s"]


def check_restarts(recipe: Recipe) -> list[Issue]:
    """Warnings for restarts that start from step 0, and for a call timeout under a measured step."""
    trainer = recipe.trainer
    issues = []
    restarts = int(trainer.max_restarts)
    if restarts > 0 and not trainer.save_every:
        issues.append(warning("trainer.save_every", (
            f"trainer.save_every: trainer.max_restarts={restarts} without periodic checkpoints (save_every: 0): every "
            "restart starts the run again from step 0; set trainer.save_every so a restart loses only the steps since "
            "the last checkpoint")))
    measured = measured_step_s(recipe)
    timeout = float(trainer.call_timeout_s)
    if measured is not None and timeout < measured:
        issues.append(warning("trainer.call_timeout_s", (
            f"trainer.call_timeout_s: {timeout:g} s is shorter than a step of this run took ({measured:.3g} s, "
            f"time/step in {Path(str(trainer.output_dir)) / 'metrics.jsonl'}): a healthy call may be cut as a lost "
            "worker; raise it above the longest step")))
    return issues


def measured_step_s(recipe: Recipe) -> float | None:
    """The longest ``time/step`` of the run this recipe resumes (its output_dir's metrics.jsonl), or None."""
    trainer = recipe.trainer
    if str(trainer.resume) == "never":
        return None
    path = Path(str(trainer.output_dir)) / "metrics.jsonl"
    if not path.is_file():
        return None
    steps = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            value = json.loads(line).get("time/step") if line.strip() else None
        except ValueError:
            continue  # a line cut short by a killed run
        if isinstance(value, (int, float)):
            steps.append(float(value))
    return max(steps) if steps else None
