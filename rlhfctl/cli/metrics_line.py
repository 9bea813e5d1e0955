"""The compact per-step metrics line shared by the reporters."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["KEY_METRICS", "format_value", "key_metrics", "metrics_line"]

#: (label, metric keys tried in order) in display order; metrics that are absent are skipped.
KEY_METRICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward/mean",)),
    ("kl", ("kl", "actor/kl_loss")),
    ("pg_loss", ("actor/pg_loss",)),
    ("vf_loss", ("critic/vf_loss",)),
    ("resp_len", ("response_length/mean",)),
    ("loss", ("loss",)),  # sft, reward_model, dpo
    ("val_reward", ("val/reward/mean",)),
    ("kl_coef", ("kl/coef",)),
    ("eval_loss", ("eval/loss",)),
    ("eval_acc", ("eval/accuracy",)),
    ("step_s", ("time/step",)),
)


def format_value(value: Any) -> str:
    """Numbers to 4 significant digits (tensors and numpy scalars included); others as str."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            pass
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def key_metrics(metrics: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, formatted value) for the key metrics present in ``metrics``."""
    shown = []
    for label, keys in KEY_METRICS:
        key = next((key for key in keys if key in metrics), None)
        if key is not None:
            shown.append((label, format_value(metrics[key])))
    return shown


def metrics_line(step: int, total: int | None, metrics: Mapping[str, Any]) -> str:
    """``step 3/40  reward=0.4 kl=0.001 ... step_s=1.2``."""
    head = f"step {step}/{total}" if total else f"step {step}"
    body = " ".join(f"{label}={value}" for label, value in key_metrics(metrics))
    return f"{head}  {body}".rstrip()
