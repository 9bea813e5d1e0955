"""Reading runs' ``metrics.jsonl`` into per-metric series, without matplotlib.

A run is its output directory (``trainer.output_dir``, or a pipeline stage's ``OUTPUT_DIR/STAGE``), which
holds ``metrics.jsonl``: one JSON object per step, ``{"step": 3, "reward/mean": 0.4, ...}`` (see
:class:`rlhfctl.trainer.metrics.MetricsLog`). A path to the file itself is accepted too. Numbers are kept;
the strings ``"nan"``, ``"inf"`` and ``"-inf"`` (how the log writes non-finite values) become floats; any
other value is not a metric and is left out. A step logged twice (a resumed run) keeps its last values.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rlhfctl.errors import UserError

__all__ = ["METRICS_FILE", "MetricsFileError", "RunMetrics", "load_run", "load_runs", "metrics_path", "run_labels"]

METRICS_FILE = "metrics.jsonl"
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
               "-infinity": -math.inf}


class MetricsFileError(UserError):
    """A run that cannot be read: no such path, no metrics.jsonl, or a line that is not a JSON object (exit 2)."""


@dataclass(frozen=True)
class RunMetrics:
    """One run's metrics: ``series[key] = (steps, values)``, steps ascending; keys in the order they first appear."""

    label: str
    path: Path
    series: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        return list(self.series)

    @property
    def steps(self) -> int:
        """How many steps were logged."""
        return len({step for steps, _ in self.series.values() for step in steps})


def metrics_path(run: str | Path) -> Path:
    """The metrics.jsonl of RUN: the directory's ``metrics.jsonl``, or RUN itself when it is a file."""
    path = Path(run).expanduser()
    if path.is_file():
        return path
    if not path.exists():
        raise MetricsFileError(f"run not found: {run} (give a run's output directory, which holds {METRICS_FILE}, "
                               f"or the {METRICS_FILE} itself)")
    file = path / METRICS_FILE
    if file.is_file():
        return file
    stages = sorted(str(child) for child in path.iterdir() if (child / METRICS_FILE).is_file())
    hint = (f"; the runs are in its subdirectories (a pipeline's stages?), give those: {', '.join(stages)}" if stages
            else " (metrics.jsonl is written when trainer.loggers lists jsonl, the default)")
    raise MetricsFileError(f"{run} has no {METRICS_FILE}{hint}")


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return _NON_FINITE.get(value.strip().lower())
    return None


def read_records(path: Path) -> list[dict]:
    """The JSON objects of a metrics.jsonl; an unfinished last line (a run still writing) is left out."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise MetricsFileError(f"cannot read {path}: {error}") from None
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    records = []
    for index, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if index == len(numbered) - 1 and index > 0:
                break  # the line a running trainer is writing
            raise MetricsFileError(f"{path}:{number}: not JSON ({error.msg}); is it a metrics.jsonl?") from None
        if not isinstance(record, dict):
            raise MetricsFileError(f"{path}:{number}: not a JSON object; is it a metrics.jsonl?")
        records.append(record)
    return records


def load_run(run: str | Path, label: str | None = None) -> RunMetrics:
    """RUN's metrics as series per key (x = the record's ``step``, else its position from 1)."""
    path = metrics_path(run)
    by_step: dict[float, dict[str, float]] = {}
    order: dict[str, None] = {}
    for position, record in enumerate(read_records(path), 1):
        step = _number(record.get("step"))
        step = float(position) if step is None or not math.isfinite(step) else step
        values = by_step.setdefault(step, {})
        for key, raw in record.items():
            value = _number(raw)
            if key != "step" and value is not None:
                order.setdefault(key, None)
                values[key] = value  # a step logged again (a resumed run) keeps its last values
    series: dict[str, tuple[list[float], list[float]]] = {key: ([], []) for key in order}
    for step in sorted(by_step):
        for key, value in by_step[step].items():
            series[key][0].append(step)
            series[key][1].append(value)
    return RunMetrics(label=label if label is not None else run_labels([run])[0], path=path, series=series)


def run_labels(runs: list[str | Path]) -> list[str]:
    """A legend name per run: its directory's name (a file not named metrics.jsonl: its stem), with as many
    parent directories as keep different runs apart (``a/ppo`` and ``b/ppo``)."""
    paths = []
    for run in runs:
        path = Path(run).expanduser().absolute()
        if path.name == METRICS_FILE:
            path = path.parent
        elif path.is_file():
            path = path.with_suffix("")  # runA.jsonl: runA
        paths.append(path)
    depths = [1] * len(paths)
    while True:
        labels = ["/".join(path.parts[-depth:]) or str(path) for path, depth in zip(paths, depths)]
        grown = False
        for index, (path, label) in enumerate(zip(paths, labels)):
            clash = any(other != path and label == labels[at] for at, other in enumerate(paths))
            if clash and depths[index] < len(path.parts):
                depths[index] += 1
                grown = True
        if not grown:
            break
    seen: dict[str, int] = {}
    unique = []
    for label in labels:  # the same run given twice
        seen[label] = seen.get(label, 0) + 1
        unique.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return unique


def load_runs(runs: list[str | Path]) -> list[RunMetrics]:
    """Every RUN, named for the legend (:func:`run_labels`)."""
    return [load_run(run, label) for run, label in zip(runs, run_labels(runs))]
