"""Each stage's headline metric, for the pipeline's final table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["HEADLINES", "headline"]

HEADLINES: dict[str, tuple[tuple[str, str], ...]] = {
    "sft": (("eval/loss", "eval loss"), ("loss/last", "loss")),
    "reward_model": (("eval/accuracy", "eval accuracy"), ("loss/last", "loss")),
    "dpo": (("eval/accuracy", "eval accuracy"), ("loss/last", "loss")),
    "ppo": (("reward/last_mean", "reward"),),
}
"""(summary key, label) tried in order for each algorithm."""


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def headline(algorithm: str, summary: Mapping[str, Any]) -> str:
    """E.g. ``eval accuracy 0.97``, ``reward 0.11 -> 2.7`` or ``-`` when nothing was logged."""
    for key, label in HEADLINES.get(algorithm, ()):
        if key not in summary:
            continue
        if key == "reward/last_mean" and "reward/first_mean" in summary:
            return f"{label} {_number(summary['reward/first_mean'])} -> {_number(summary[key])}"
        if key == "loss/last" and "loss/first" in summary:
            return f"{label} {_number(summary['loss/first'])} -> {_number(summary[key])}"
        return f"{label} {_number(summary[key])}"
    return "-"
