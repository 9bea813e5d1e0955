"""Which panels to draw: the metric names asked for (or the defaults) matched against the runs' keys.

A metric name is matched against the keys of all runs together, in this order:

* an exact key: ``reward/mean``, ``kl``;
* a glob (it holds ``*``, ``?`` or ``[``), ``fnmatch`` style, ``*`` crossing ``/``: ``time/*``, ``reward/*/mean``;
* otherwise a prefix up to a ``/``: ``time`` or ``time/`` is every ``time/...`` key (``time/*``).

Each name asked for is one panel; the keys a glob or prefix matches share it, one line per key and run.
A name that matches nothing is skipped with a note. The defaults (:data:`DEFAULT_METRICS`) are the
reward, the KL, the entropy, the response length and the phase times, each under the one of its keys
that the most runs logged, the first on a tie (a PPO-family run logs ``kl`` when the step computed the KL
to the reference, and ``actor/kl_loss`` when the actor's loss holds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable

from rlhfctl.errors import UserError
from rlhfctl.plotting.metrics_file import RunMetrics
from rlhfctl.recipe.errors import did_you_mean

__all__ = ["DEFAULT_METRICS", "MetricSpec", "NoSuchMetricsError", "Panel", "choose_panels", "match_keys", "split_metrics"]

_GLOB = ("*", "?", "[")


class NoSuchMetricsError(UserError):
    """None of the metrics asked for is in any run (exit 2); the message lists the metrics the runs have."""


@dataclass(frozen=True)
class MetricSpec:
    """One panel asked for: of ``patterns``, the one that matches keys in the most runs is drawn (the first on a tie)."""

    name: str
    patterns: tuple[str, ...]

    @classmethod
    def of(cls, pattern: str) -> "MetricSpec":
        return cls(pattern, (pattern,))


@dataclass(frozen=True)
class Panel:
    """One subplot: ``keys`` are drawn for every run that has them (x = step)."""

    title: str
    keys: tuple[str, ...]

    @property
    def unit(self) -> str:
        """The y axis label: seconds for ``time/`` keys, else none."""
        return "seconds" if all(key.startswith("time/") for key in self.keys) else ""


#: What ``rlhfctl plot`` draws without ``--metrics``: one panel each, the phase times (``time/*``) together.
DEFAULT_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("reward", ("reward/mean",)),
    MetricSpec("KL", ("kl", "actor/kl_loss")),
    MetricSpec("entropy", ("actor/entropy", "entropy")),
    MetricSpec("response length", ("response_length/mean",)),
    MetricSpec("phase times", ("time/*",)),
)


def split_metrics(values: Iterable[str]) -> list[MetricSpec]:
    """``--metrics a,b --metrics c``: one spec per name, in order, repeats dropped."""
    names = [name.strip() for value in values for name in value.split(",")]
    return [MetricSpec.of(name) for name in dict.fromkeys(name for name in names if name)]


def match_keys(pattern: str, keys: Iterable[str]) -> list[str]:
    """The keys ``pattern`` names: itself when it is a key, else the keys its glob or ``prefix/`` matches."""
    keys = list(keys)
    if pattern in keys:
        return [pattern]
    if any(char in pattern for char in _GLOB):
        return [key for key in keys if fnmatchcase(key, pattern)]
    prefix = pattern.rstrip("/") + "/"
    return [key for key in keys if key.startswith(prefix)]


def _all_keys(runs: list[RunMetrics]) -> list[str]:
    return list(dict.fromkeys(key for run in runs for key in run.keys))


def _best_match(spec: MetricSpec, keys: list[str], runs: list[RunMetrics]) -> tuple[str, list[str]] | None:
    """The first of the spec's patterns that matches keys in the most runs, with the keys it matches."""
    best, best_runs = None, 0
    for pattern in spec.patterns:
        matched = match_keys(pattern, keys)
        having = sum(1 for run in runs if any(key in run.series for key in matched))
        if matched and having > best_runs:
            best, best_runs = (pattern, matched), having
    return best


def choose_panels(runs: list[RunMetrics], specs: Iterable[MetricSpec] | None = None) -> tuple[list[Panel], list[str]]:
    """The panels to draw for ``specs`` (default :data:`DEFAULT_METRICS`), and notes on what was skipped.

    Raises :class:`NoSuchMetricsError` when no spec matches any run's keys.
    """
    asked = list(specs) if specs is not None else list(DEFAULT_METRICS)
    keys = _all_keys(runs)
    panels: list[Panel] = []
    notes: list[str] = []
    for spec in asked:
        found = _best_match(spec, keys, runs)
        if found is None:
            wanted = spec.name if spec.patterns == (spec.name,) else f"{spec.name} ({' or '.join(spec.patterns)})"
            glob = any(char in spec.name for char in _GLOB)
            hint = did_you_mean(spec.name, keys) if len(spec.patterns) == 1 and not glob else ""
            notes.append(f"skipped {wanted}: no run has it{hint}")
            continue
        pattern, matched = found
        if len(matched) == 1:
            title = matched[0]
        else:
            title = pattern if any(char in pattern for char in _GLOB) else pattern.rstrip("/") + "/*"
        panel = Panel(title=title, keys=tuple(matched))
        if panel not in panels:
            panels.append(panel)
    if not panels:
        names = ", ".join(spec.name for spec in asked)
        where = ", ".join(run.label for run in runs)
        if not keys:
            raise NoSuchMetricsError(f"no metrics logged yet in {where}")
        raise NoSuchMetricsError(f"none of the metrics {names} is in {where}; their metrics: {', '.join(keys)}")
    for panel in panels:
        for run in runs:
            if run.keys and not any(key in run.series for key in panel.keys):
                notes.append(f"{run.label} has no {panel.title}")
    return panels, notes
