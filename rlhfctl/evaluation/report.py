"""The numbers of an evaluation: mean@n and pass@k per data source, with 95% confidence intervals.

Pure functions of per-sample scores; no I/O. Samples are grouped by prompt (``groups``: one id per prompt, ``n``
samples each). The intervals are over prompts, the unit that was drawn: a prompt's ``n`` samples are not independent.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["Z_95", "eval_report", "mean_with_interval", "pass_at_k", "report_ks"]

Z_95 = 1.959963984540054
"""The two-sided 95% quantile of the normal distribution."""


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The chance that at least one of ``k`` samples drawn without replacement from ``n`` (``correct`` of them right)
    is right: ``1 - C(n - c, k) / C(n, k)``, the unbiased estimator of Chen et al. 2021 (arXiv:2107.03374)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def mean_with_interval(values: np.ndarray) -> tuple[float, float]:
    """The mean and the half-width of its 95% normal interval (0 for a single value)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float(values.mean()), 0.0
    return float(values.mean()), float(Z_95 * values.std(ddof=1) / math.sqrt(len(values)))


def report_ks(n: int) -> list[int]:
    """The k of the pass@k columns: 1, the powers of two below ``n``, and ``n``."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def _by_prompt(values: np.ndarray, groups: np.ndarray) -> dict[Any, list[float]]:
    per_prompt: dict[Any, list[float]] = {}
    for group, value in zip(groups.tolist(), values.tolist()):
        per_prompt.setdefault(group, []).append(float(value))
    return per_prompt


def _source_report(scores: np.ndarray, correct: np.ndarray | None, groups: np.ndarray, ks: list[int]) -> dict[str, Any]:
    means = [float(np.mean(values)) for values in _by_prompt(scores, groups).values()]
    mean, interval = mean_with_interval(np.array(means))
    entry: dict[str, Any] = {"prompts": len(means), "samples": int(len(scores)), "mean": mean, "mean_ci95": interval}
    if correct is not None:
        per_prompt = list(_by_prompt(correct, groups).values())
        for k in ks:
            value, half = mean_with_interval(np.array([pass_at_k(len(v), int(sum(v)), k) for v in per_prompt]))
            entry[f"pass@{k}"], entry[f"pass@{k}_ci95"] = value, half
    return entry


def eval_report(scores: np.ndarray, groups: np.ndarray, sources: np.ndarray | None, n: int,
                correct: np.ndarray | None = None) -> dict[str, dict[str, Any]]:
    """``{"all": {...}, "<data_source>": {...}}``: prompts, samples, ``mean`` (mean@n: the mean score of a prompt's
    samples, averaged over prompts) and, with ``correct`` (0/1 per sample), ``pass@k`` for :func:`report_ks`; each with
    its ``_ci95`` half-width."""
    ks = report_ks(n) if correct is not None else []
    report = {"all": _source_report(scores, correct, groups, ks)}
    if sources is not None:
        labels = np.array([str(value) for value in sources], dtype=object)
        for source in sorted(set(labels.tolist())):
            chosen = labels == source
            report[source] = _source_report(scores[chosen], None if correct is None else correct[chosen], groups[chosen], ks)
    return report
