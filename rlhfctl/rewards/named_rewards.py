"""Several rewards at once, by name: each sample gets ``{"score": sum_k w_k * r_k, name_k: r_k, ...}``.

This is how a recipe gives gdpo (and the DAPO filter) named rewards::

    roles:
      reward:
        function: rlhfctl.rewards:combined
        function_kwargs:
          rewards:
            acc: rlhfctl.rewards:gsm8k
            format: {function: rlhfctl.rewards:format, kwargs: {pattern: "#### -?[0-9.,]+$"}}
          weights: {acc: 1.0, format: 0.1}

Each entry is a reward spec, ``"module:function"`` or ``"path/to/file.py:function"`` as
``roles.reward.function`` takes, or ``{function: spec, kwargs: {...}}``. Each reward is called once on
the whole batch, with the data columns its signature accepts plus its ``kwargs``. A reward that
returns named scores itself (a dict per sample, or a dict of per-sample lists, as the reward worker
takes) contributes its ``"score"`` as ``r_k`` and its other named scores as ``"<name>.<key>"``. Names
follow the reward worker's rule (:func:`rlhfctl.tasks.reward_fn.named_score_problem`): non-empty,
no ``/``, not ``score``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from rlhfctl.rewards.batch import check_batch
from rlhfctl.rewards.errors import RewardSettingError
from rlhfctl.tasks.reward_fn import named_score_problem

__all__ = ["combined"]

_SPEC_KEYS = ("function", "kwargs")


@functools.cache
def _load(spec: str) -> Callable[..., Any]:
    # Imported here, not at the top: the workers package brings in torch.
    from rlhfctl.rewards.functions import load_reward_function

    return load_reward_function(spec)


def _parse_entry(name: Any, entry: Any) -> tuple[str, dict[str, Any]]:
    """One ``rewards`` entry as (function spec, kwargs)."""
    problem = named_score_problem(name)
    if problem:
        raise RewardSettingError(f"combined: rewards.{name}: {problem}")
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, Mapping) and "function" in entry and set(entry) <= set(_SPEC_KEYS):
        kwargs = entry.get("kwargs") or {}
        if isinstance(entry["function"], str) and isinstance(kwargs, Mapping):
            return entry["function"], dict(kwargs)
    raise RewardSettingError(
        f"combined: rewards.{name} must be 'module:function' or {{function: 'module:function', kwargs: {{...}}}}, "
        f"got {entry!r}"
    )


def _weights(weights: Mapping[str, Any] | None, names: list[str]) -> dict[str, float]:
    """Each reward's weight: ``weights[name]``, 1.0 for a name ``weights`` leaves out."""
    weights = {} if weights is None else weights
    if not isinstance(weights, Mapping):
        raise RewardSettingError(f"combined: weights must map reward names to numbers, got {weights!r}")
    stray = [name for name in weights if name not in names]
    if stray:
        raise RewardSettingError(f"combined: weights for {', '.join(map(repr, stray))}, which rewards does not name ({', '.join(names)})")
    try:
        return {name: float(weights.get(name, 1.0)) for name in names}
    except (TypeError, ValueError):
        raise RewardSettingError(f"combined: every weight must be a number, got {dict(weights)!r}") from None


def _accepted(function: Callable[..., Any], columns: Mapping[str, Any]) -> dict[str, Any]:
    """The columns ``function`` takes: all with ``**kwargs`` (or an unreadable signature), else those it names."""
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return dict(columns)
    if any(param.kind is param.VAR_KEYWORD for param in params):
        return dict(columns)
    named = {param.name for param in params if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)}
    return {key: value for key, value in columns.items() if key in named}


def _per_sample(result: Any, name: str, count: int) -> list[Any]:
    """A sub-reward's output as one value (a number or a dict of scores) per sample."""
    result = result.tolist() if callable(getattr(result, "tolist", None)) else result
    if isinstance(result, Mapping):  # the column form: name -> one value per sample
        columns = {key: value.tolist() if callable(getattr(value, "tolist", None)) else value for key, value in result.items()}
        if all(isinstance(value, (list, tuple)) and len(value) == count for value in columns.values()):
            return [{key: value[row] for key, value in columns.items()} for row in range(count)]
    elif not isinstance(result, (str, bytes)) and hasattr(result, "__len__") and len(result) == count:
        return list(result)
    raise ValueError(f"combined: reward {name!r} returned {result!r:.200}; it must return one score per sample ({count})")


def _named_scores(result: Any, name: str, count: int) -> list[dict[str, float]]:
    """A sub-reward's output as one ``{name: r, name.key: v}`` dict per sample."""
    rows = []
    for value in _per_sample(result, name, count):
        extra = dict(value) if isinstance(value, Mapping) else {}
        total = extra.pop("score", None) if isinstance(value, Mapping) else value
        try:
            rows.append({name: float(total), **{f"{name}.{key}": float(item) for key, item in extra.items()}})
        except (TypeError, ValueError):
            raise ValueError(
                f"combined: reward {name!r} returned {value!r} for a sample: not a number or a dict with a numeric 'score'"
            ) from None
    return rows


def combined(
    prompts: list[str], responses: list[str], rewards: Mapping[str, Any], weights: Mapping[str, float] | None = None, **columns: Any
) -> list[dict[str, float]]:
    """Per sample ``{"score": sum_k weights[k] * r_k, k: r_k, ...}`` over the named ``rewards`` (see the module docstring)."""
    check_batch(prompts, responses, **columns)
    if not isinstance(rewards, Mapping) or not rewards:
        raise RewardSettingError(f"combined: rewards must map names to reward functions, got {rewards!r}")
    entries = {name: _parse_entry(name, entry) for name, entry in rewards.items()}
    weight_of = _weights(weights, list(entries))
    rows: list[dict[str, float]] = [{"score": 0.0} for _ in responses]
    for name, (spec, kwargs) in entries.items():
        function = _load(spec)
        result = function(prompts=list(prompts), responses=list(responses), **{**_accepted(function, columns), **kwargs})
        for row, named in zip(rows, _named_scores(result, name, len(responses))):
            row["score"] += weight_of[name] * named[name]
            row.update(named)
    return rows
