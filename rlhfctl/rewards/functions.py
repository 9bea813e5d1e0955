"""User reward functions: load ``module:function`` / ``file.py:function`` and call them safely.

The contract (see :mod:`rlhfctl.tasks.reward_fn`)::

    fn(prompts: list[str], responses: list[str], **columns: list, **function_kwargs) -> list[float]
        (or one mapping per sample with a "score" and named scores, or a mapping of name -> list)

Loading problems and exceptions raised inside the function become :class:`RewardFunctionError`;
a return value that breaks the contract (wrong length, non-numbers, NaN/inf, a mapping without
"score", named scores that differ between samples) is a :class:`RewardOutputError`, also a ``ValueError``.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from rlhfctl.errors import UserError
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.importing import import_python_file
from rlhfctl.single_controller import rank_progress
from rlhfctl.tasks.reward_fn import NAMED_SCORE_PREFIX, named_score_problem

__all__ = [
    "AGENT_METRIC_PREFIX",
    "CONVERSATION_COLUMNS",
    "INTERNAL_COLUMNS",
    "ON_ERROR_POLICIES",
    "RewardFunctionError",
    "RewardOutputError",
    "RewardScores",
    "call_reward_function",
    "conversation_columns_taken",
    "function_kwargs_problem",
    "is_internal_column",
    "load_reward_function",
    "reward_call_problem",
]

ON_ERROR_POLICIES = ("raise", "zero")

CONVERSATION_COLUMNS = ("messages", "tool_rewards", "num_turns", "reward_extra")
"""What an agent rollout adds for the reward (``rollout.multi_turn``): the whole conversation, the sum of the
tools' rewards, the assistant turns and the loop's extra dict. Each goes only to a function that takes it by
name or through ``**kwargs``, so functions written for single-turn rollouts keep working."""

INTERNAL_COLUMNS = frozenset({"uid", "response_text", "prompt_text", "prompt_messages", "score", "reward_error"})
"""Non-tensor columns not passed to reward functions (the rest go in as keyword lists); so are the named-score
columns ``reward/<name>`` and an agent rollout's per-sample metrics ``agent/<name>`` (:func:`is_internal_column`)."""

AGENT_METRIC_PREFIX = "agent/"


def is_internal_column(name: str) -> bool:
    """Whether a non-tensor column is the pipeline's own, not data for the reward function."""
    return name in INTERNAL_COLUMNS or str(name).startswith((NAMED_SCORE_PREFIX, AGENT_METRIC_PREFIX))


def conversation_columns_taken(function: Callable[..., Any], present: Sequence[str]) -> list[str]:
    """Those of :data:`CONVERSATION_COLUMNS` in ``present`` that ``function``'s signature accepts by name or
    ``**kwargs`` (all of them when the signature cannot be read)."""
    offered = [name for name in CONVERSATION_COLUMNS if name in present]
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return offered
    if any(param.kind is param.VAR_KEYWORD for param in params):
        return offered
    named = {param.name for param in params if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)}
    return [name for name in offered if name in named]


class RewardFunctionError(UserError, RuntimeError):
    """A reward function could not be loaded, or raised while scoring."""


class RewardOutputError(RewardFunctionError, ValueError):
    """A reward function returned the wrong number of scores, a non-number, NaN or infinity, a mapping without
    "score", or named scores that some sample lacks."""


def _looks_like_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target


def _import_file(path_text: str, spec_text: str) -> ModuleType:
    path = os.path.abspath(os.path.expanduser(path_text))
    if not os.path.isfile(path):
        raise RewardFunctionError(
            f"reward function file {path_text!r} (from {spec_text!r}) not found; relative paths are resolved "
            f"from the current directory {os.getcwd()!r}"
        )
    try:
        return import_python_file(Path(path), prefix="rlhfctl_user_reward")
    except Exception as error:
        raise RewardFunctionError(
            f"importing reward function file {path_text!r} (from {spec_text!r}) failed: "
            f"{type(error).__name__}: {error}"
        ) from error


def _import_module(module_name: str, spec_text: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except Exception as error:
        raise RewardFunctionError(
            f"cannot import module {module_name!r} for reward function {spec_text!r}: {type(error).__name__}: {error}"
        ) from error


def load_reward_function(spec: str) -> Callable[..., Any]:
    """Resolve ``"package.module:function"`` or ``"path/to/file.py:function"`` (relative to the cwd)."""
    if not isinstance(spec, str) or ":" not in spec:
        module, _, name = str(spec).rpartition(".")
        hint = f"; did you mean '{module}:{name}'?" if module and name.isidentifier() and not _looks_like_file(spec) else ""
        raise RewardFunctionError(
            f"roles.reward.function: {spec!r} must be 'package.module:function' or 'path/to/file.py:function' "
            f"(a colon before the function name){hint}"
        )
    target, _, attribute = spec.rpartition(":")
    target, attribute = target.strip(), attribute.strip()
    if not target or not attribute.isidentifier():
        raise RewardFunctionError(
            f"roles.reward.function {spec!r} is malformed: expected 'package.module:function' or "
            "'path/to/file.py:function'"
        )
    module = _import_file(target, spec) if _looks_like_file(target) else _import_module(target, spec)
    function = getattr(module, attribute, None)
    if function is None:
        raise RewardFunctionError(f"{target!r} has no attribute {attribute!r} (roles.reward.function = {spec!r})")
    if not callable(function):
        raise RewardFunctionError(f"{spec!r} is a {type(function).__name__}, not a callable reward function")
    return function


def function_kwargs_problem(columns: Sequence[str], kwargs: Mapping[str, Any] | None) -> str | None:
    """Why ``roles.reward.function_kwargs`` cannot go in beside these data columns (a name taken twice), or None."""
    for key in kwargs or {}:
        if key in ("prompts", "responses"):
            return (
                f"roles.reward.function_kwargs {key!r} is the reward worker's own argument {key!r} (the decoded "
                "texts); rename the keyword"
            )
        if key in columns:
            return (
                f"roles.reward.function_kwargs {key!r} is also the data column {key!r}: the function would get it "
                "twice; rename the keyword or the dataset column"
            )
    return None


def _unknown_setting_problem(function: Callable[..., Any], kwargs: Mapping[str, Any] | None) -> str | None:
    """A keyword outside the settings a function declares in ``known_function_kwargs`` (one that takes the data
    columns through ``**columns`` would otherwise swallow a misspelt setting), or None."""
    known = getattr(function, "known_function_kwargs", None)
    unknown = [key for key in kwargs or {} if known is not None and key not in known]
    if not unknown:
        return None
    name = getattr(function, "__name__", type(function).__name__)
    return (f"roles.reward.function_kwargs.{unknown[0]}: {name} has no setting {unknown[0]!r}; its settings are "
            f"{', '.join(sorted(known)) or 'none'}")


def reward_call_problem(
    function: Callable[..., Any], columns: Sequence[str], kwargs: Mapping[str, Any] | None = None
) -> str | None:
    """Why ``function`` cannot take the call :func:`call_reward_function` makes with these data columns and
    ``roles.reward.function_kwargs``, or None.

    The call is ``function(prompts=[...], responses=[...], **columns, **kwargs)``: no keyword may be a data
    column, every required parameter must be one of those names, and without ``**kwargs`` every name passed
    must be a parameter.
    """
    clash = function_kwargs_problem(columns, kwargs) or _unknown_setting_problem(function, kwargs)
    if clash:
        return clash
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None  # a builtin or extension callable: nothing to read
    params = list(signature.parameters.values())
    passed = ["prompts", "responses", *columns, *(kwargs or {})]
    takes_any = any(param.kind is param.VAR_KEYWORD for param in params)
    by_keyword = {param.name for param in params if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)}
    missing = [
        param.name for param in params
        if param.default is param.empty and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
        and (param.kind is param.POSITIONAL_ONLY or param.name not in passed)
    ]
    unexpected = [] if takes_any else [name for name in passed if name not in by_keyword]
    if not missing and not unexpected:
        return None
    problems = []
    if missing:
        problems.append(f"it needs {', '.join(map(repr, missing))}, which the reward worker does not pass")
    if unexpected:
        problems.append(f"it does not take {', '.join(map(repr, unexpected))}")
    call = "fn(prompts=[...], responses=[...], **columns, **function_kwargs)" if kwargs else (
        "fn(prompts=[...], responses=[...], **columns)")
    given = f"; roles.reward.function_kwargs: {', '.join(kwargs)}" if kwargs else ""
    return (
        f"{getattr(function, '__name__', type(function).__name__)}{signature} is called as {call} and "
        f"{' and '.join(problems)} (data columns: {', '.join(columns) or 'none'}{given}); take prompts and "
        "responses, the columns you need by name, and the rest with **columns"
    )


# ---------------------------------------------------------------------------------- what a function returns
def _is_number(value: Any) -> bool:
    """A Python or NumPy number or bool (a named score); strings and other objects are not."""
    return isinstance(value, (numbers.Real, np.bool_)) and not isinstance(value, (str, bytes))


def _number(value: Any, key: str, name: str, index: int) -> float:
    what = "score" if key == "score" else repr(key)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RewardOutputError(f"reward function {name} returned a non-number {what} ({value!r}) for sample {index}") from None
    if not math.isfinite(number):
        raise RewardOutputError(f"reward function {name} returned a non-finite {what} ({number}) for sample {index}")
    return number


def _rows_of_columns(result: Mapping[Any, Any], name: str, start: int, count: int) -> list[dict[Any, Any]]:
    """The column form ``{"score": [...], "acc": [...]}`` as one mapping per sample."""
    if "score" not in result:
        raise RewardOutputError(
            f"reward function {name} returned a mapping without 'score' for samples {start}..{start + count - 1}; "
            "the column form maps 'score' (the reward) and each named score to one value per sample"
        )
    columns = {}
    for key, values in result.items():
        values = values.tolist() if hasattr(values, "tolist") and callable(values.tolist) else values
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != count:
            size = f"{len(values)} values" if isinstance(values, Sequence) and not isinstance(values, (str, bytes)) else (
                f"a {type(values).__name__}")
            raise RewardOutputError(
                f"reward function {name} returned {size} for {key!r} for {count} samples (samples {start}.."
                f"{start + count - 1}); the column form maps each name to a list of one value per sample"
            )
        columns[key] = values
    return [{key: values[offset] for key, values in columns.items()} for offset in range(count)]


def _named_rows(
    rows: Sequence[Any], name: str, start: int, reference: tuple[list[str], int] | None
) -> tuple[list[float], dict[str, list[float]]]:
    """Scores and named scores of one mapping per sample; every sample carries the names of ``reference``
    (the names and the sample that first gave them), else of this chunk's first sample."""
    scores: list[float] = []
    named: dict[str, list[float]] = {}
    for offset, row in enumerate(rows):
        index = start + offset
        if not isinstance(row, Mapping):
            raise RewardOutputError(
                f"reward function {name} returned a {type(row).__name__} for sample {index} beside mappings; return "
                "one mapping per sample (each with a 'score'), or one float per sample"
            )
        if "score" not in row:
            raise RewardOutputError(
                f"reward function {name} returned a mapping without 'score' for sample {index} (keys: "
                f"{', '.join(map(repr, row)) or 'none'}); each mapping needs a numeric 'score', the reward"
            )
        scores.append(_number(row["score"], "score", name, index))
        found = [key for key, value in row.items() if key != "score" and _is_number(value)]
        if reference is None:
            for key in found:
                problem = named_score_problem(key)
                if problem:
                    raise RewardOutputError(f"reward function {name}, sample {index}: {problem}")
            reference = (found, index)
        _check_same_names(found, reference, name, index)
        for key in reference[0]:
            named.setdefault(key, []).append(_number(row[key], key, name, index))
    return scores, named


def _check_same_names(found: Sequence[Any], reference: tuple[list[str], int], name: str, index: int) -> None:
    names, first = reference
    missing = [key for key in names if key not in found]
    extra = [key for key in found if key not in names]
    if missing or extra:
        key, has, lacks = (missing[0], first, index) if missing else (extra[0], index, first)
        raise RewardOutputError(
            f"reward function {name} returned no number for {key!r} for sample {lacks} (sample {has} has one); "
            "every sample must carry the same named scores (strings and other non-numbers are ignored)"
        )


def _as_scores(
    result: Any, name: str, start: int, count: int, reference: tuple[list[str], int] | None = None
) -> tuple[list[float], dict[str, list[float]]]:
    """One chunk's scores and named scores (name -> one float per sample) from any of the return forms."""
    if hasattr(result, "tolist") and callable(result.tolist):
        result = result.tolist()
    if isinstance(result, Mapping):
        result = _rows_of_columns(result, name, start, count)
    if isinstance(result, (str, bytes)) or not isinstance(result, Sequence):
        raise RewardOutputError(
            f"reward function {name} returned a {type(result).__name__}; it must return a list of {count} floats, "
            f"a list of {count} mappings each with a 'score', or a mapping of 'score' and other names to lists"
        )
    if len(result) != count:
        raise RewardOutputError(f"reward function {name} returned {len(result)} scores for {count} samples")
    if any(isinstance(value, Mapping) for value in result):
        return _named_rows(result, name, start, reference)
    if reference is not None:
        _check_same_names([], reference, name, start)
    return [_number(value, "score", name, start + offset) for offset, value in enumerate(result)], {}


class RewardScores(NamedTuple):
    """What :func:`call_reward_function` gives back, one entry per sample."""

    scores: list[float]
    errored: list[bool]
    named: dict[str, list[float]]
    """Named scores, name -> floats (0.0 where ``errored``); empty when the function returns plain floats."""


def call_reward_function(
    function: Callable[..., Any],
    name: str,
    prompts: list[str],
    responses: list[str],
    columns: Mapping[str, list[Any]],
    *,
    kwargs: Mapping[str, Any] | None = None,
    batch_size: int | None = None,
    on_error: str = "raise",
    names: Sequence[str] = (),
) -> RewardScores:
    """Score samples in chunks of ``batch_size`` (None = all at once), passing ``kwargs`` on every call.

    An exception inside ``function`` raises :class:`RewardFunctionError` naming the chunk's sample
    range (``on_error="raise"``), or scores the chunk 0.0 and flags it (``on_error="zero"``), its named
    scores too: those of the other chunks, or ``names`` (an earlier call's) when every chunk fails.
    """
    if on_error not in ON_ERROR_POLICIES:
        raise RecipeError(f"roles.reward.on_error must be one of {ON_ERROR_POLICIES}, got {on_error!r}", "roles.reward.on_error", "bad_choice")
    clash = function_kwargs_problem(list(columns), kwargs)
    if clash:
        raise RewardFunctionError(clash)
    total = len(responses)
    step = total if not batch_size else max(1, int(batch_size))
    scores: list[float] = []
    errored: list[bool] = []
    chunks: list[dict[str, list[float]] | None] = []  # None: a zeroed chunk
    reference: tuple[list[str], int] | None = None
    for start in range(0, total, step):
        stop = min(total, start + step)
        chunk_columns = {key: list(values[start:stop]) for key, values in columns.items()}
        try:
            result = function(
                prompts=list(prompts[start:stop]), responses=list(responses[start:stop]), **chunk_columns, **(kwargs or {})
            )
        except Exception as error:
            problem = reward_call_problem(function, list(chunk_columns), kwargs) if isinstance(error, TypeError) else None
            if problem:  # the call itself does not fit: no sample can be scored, whatever on_error says
                raise RewardFunctionError(f"roles.reward.function: {problem}") from error
            if on_error != "zero":
                raise RewardFunctionError(
                    f"reward function {name} raised {type(error).__name__}: {error} (samples {start}..{stop - 1} "
                    f"of {total})"
                ) from error
            chunk_scores, chunk_named, failed = [0.0] * (stop - start), None, True
        else:
            chunk_scores, chunk_named = _as_scores(result, name, start, stop - start, reference)
            failed = False
            reference = reference or (list(chunk_named), start)
        scores.extend(chunk_scores)
        errored.extend([failed] * (stop - start))
        chunks.append(chunk_named)
        rank_progress.report(stop, total, "rows")
    return RewardScores(scores, errored, _join_named(chunks, reference[0] if reference else list(names), step, total))


def _join_named(chunks: list[dict[str, list[float]] | None], names: list[str], step: int, total: int) -> dict[str, list[float]]:
    """The chunks' named scores end to end, 0.0 for each sample of a zeroed chunk (None)."""
    joined: dict[str, list[float]] = {key: [] for key in names}
    for index, chunk in enumerate(chunks):
        size = min(total, (index + 1) * step) - index * step
        for key in names:
            joined[key].extend([0.0] * size if chunk is None else chunk[key])
    return joined
