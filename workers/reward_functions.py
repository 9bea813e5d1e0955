"""User reward functions: load ``module:function`` / ``file.py:function`` and call them safely.

The contract (see :mod:`rlhfctl.tasks.reward_fn`)::

    fn(prompts: list[str], responses: list[str], **columns: list) -> list[float]

Loading problems and exceptions raised inside the function become :class:`RewardFunctionError`;
a return value that breaks the contract (wrong length, non-numbers, NaN/inf) is a ``ValueError``.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from rlhfctl.errors import UserError
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.importing import import_python_file
from rlhfctl.single_controller import rank_progress

__all__ = [
    "ON_ERROR_POLICIES",
    "RewardFunctionError",
    "call_reward_function",
    "load_reward_function",
    "reward_call_problem",
]

ON_ERROR_POLICIES = ("raise", "zero")


class RewardFunctionError(UserError, RuntimeError):
    """A reward function could not be loaded, or raised while scoring."""


class RewardOutputError(RewardFunctionError, ValueError):
    """A reward function returned the wrong number of scores, a non-number, NaN or infinity."""


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


def reward_call_problem(function: Callable[..., Any], columns: Sequence[str]) -> str | None:
    """Why ``function`` cannot take the call :func:`call_reward_function` makes with these data columns, or None.

    The call is ``function(prompts=[...], responses=[...], **columns)``: every required parameter must be
    one of those names, and without ``**kwargs`` every name passed must be a parameter.
    """
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None  # a builtin or extension callable: nothing to read
    params = list(signature.parameters.values())
    passed = ["prompts", "responses", *columns]
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
    return (
        f"{getattr(function, '__name__', type(function).__name__)}{signature} is called as "
        f"fn(prompts=[...], responses=[...], **columns) and {' and '.join(problems)} (data columns: "
        f"{', '.join(columns) or 'none'}); take prompts and responses, the columns you need by name, "
        "and the rest with **columns"
    )


def _as_scores(result: Any, name: str, start: int, count: int) -> list[float]:
    if hasattr(result, "tolist") and callable(result.tolist):
        result = result.tolist()
    if isinstance(result, (str, bytes)) or not isinstance(result, Sequence):
        raise RewardOutputError(
            f"reward function {name} returned a {type(result).__name__}; it must return a list of {count} floats"
        )
    if len(result) != count:
        raise RewardOutputError(f"reward function {name} returned {len(result)} scores for {count} samples")
    scores = []
    for offset, value in enumerate(result):
        try:
            score = float(value)
        except (TypeError, ValueError):
            raise RewardOutputError(
                f"reward function {name} returned a non-number ({value!r}) for sample {start + offset}"
            ) from None
        if not math.isfinite(score):
            raise RewardOutputError(
                f"reward function {name} returned a non-finite score ({score}) for sample {start + offset}"
            )
        scores.append(score)
    return scores


def call_reward_function(
    function: Callable[..., Any],
    name: str,
    prompts: list[str],
    responses: list[str],
    columns: Mapping[str, list[Any]],
    *,
    batch_size: int | None = None,
    on_error: str = "raise",
) -> tuple[list[float], list[bool]]:
    """Score samples in chunks of ``batch_size`` (None = all at once); returns (scores, errored).

    An exception inside ``function`` raises :class:`RewardFunctionError` naming the chunk's sample
    range (``on_error="raise"``), or scores the chunk 0.0 and flags it (``on_error="zero"``).
    """
    if on_error not in ON_ERROR_POLICIES:
        raise RecipeError(f"roles.reward.on_error must be one of {ON_ERROR_POLICIES}, got {on_error!r}", "roles.reward.on_error", "bad_choice")
    total = len(responses)
    step = total if not batch_size else max(1, int(batch_size))
    scores: list[float] = []
    errored: list[bool] = []
    for start in range(0, total, step):
        stop = min(total, start + step)
        chunk_columns = {key: list(values[start:stop]) for key, values in columns.items()}
        try:
            result = function(prompts=list(prompts[start:stop]), responses=list(responses[start:stop]), **chunk_columns)
        except Exception as error:
            problem = reward_call_problem(function, list(chunk_columns)) if isinstance(error, TypeError) else None
            if problem:  # the call itself does not fit: no sample can be scored, whatever on_error says
                raise RewardFunctionError(f"roles.reward.function: {problem}") from error
            if on_error == "zero":
                scores.extend([0.0] * (stop - start))
                errored.extend([True] * (stop - start))
                rank_progress.report(stop, total, "rows")
                continue
            raise RewardFunctionError(
                f"reward function {name} raised {type(error).__name__}: {error} (samples {start}..{stop - 1} "
                f"of {total})"
            ) from error
        scores.extend(_as_scores(result, name, start, stop - start))
        errored.extend([False] * (stop - start))
        rank_progress.report(stop, total, "rows")
    return scores, errored
