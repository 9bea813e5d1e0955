"""Tasks, generated at run time, that recipes name with ``data.task`` (or mix with ``data.tasks``) instead of files.

A task name is a bundled task (``digits``, ``arithmetic``, ...), a bundled task with settings,
``repeat[?key=value&...]`` (:mod:`rlhfctl.tasks.task_query` reads the query, the task checks its keys), or a
reasoning-gym dataset, ``reasoning_gym:<dataset>[?key=value&...]`` (:mod:`rlhfctl.tasks.reasoning_gym`, resolved
on first use, so reasoning-gym is imported only by recipes that name it). :func:`task_name_problem` is the one rule of what
names a task: the recipe's choice check of ``data.task``, the ``data.tasks`` check and :func:`get_task` read it.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlhfctl.tasks import arithmetic, code_echo, digits, mixture, preferences, reasoning_gym, repeat
from rlhfctl.tasks.reward_fn import RewardFn, check_reward_inputs
from rlhfctl.tasks.task import Task, UnknownTaskError
from rlhfctl.tasks.task_query import parse_query, split_name

__all__ = [
    "RewardFn",
    "Task",
    "UnknownTaskError",
    "check_reward_inputs",
    "data_task",
    "get_task",
    "mixture_problems",
    "mixture_task",
    "task_name_pattern",
    "task_name_problem",
    "task_names",
]


_TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("digits", digits.make_prompts, digits.score, "reward = fraction of response characters that are digits",
             preferences.make_demonstrations, preferences.make_preferences),
        Task("copy", digits.make_prompts, digits.copy_score, "reward = partial credit for reproducing the digits; demonstrations copy them",
             digits.make_copy_demonstrations),
        Task("arithmetic", arithmetic.make_prompts, arithmetic.score,
             "reward = 1 when the final answer is the product; demonstrations call the calculator tool",
             arithmetic.make_demonstrations),
        Task("arithmetic-direct", arithmetic.make_prompts, arithmetic.score,
             "the arithmetic task with demonstrations that answer without the tool (the model-alone baseline)",
             arithmetic.make_direct_demonstrations),
        Task("code_echo", code_echo.make_prompts, code_echo.score,
             "reward = the program prints the number (rlhfctl.rewards:code runs it); demonstrations print it",
             code_echo.make_demonstrations),
    )
}

#: Bundled tasks that take settings in their name (``repeat?max_len=8``): name -> the builder of the task a name
#: and its parsed query give (raising UnknownTaskError for a setting it does not take).
_TASKS_WITH_SETTINGS: dict[str, Callable[[str, Mapping[str, Any]], Task]] = {repeat.NAME: repeat.task}

_REASONING_GYM_FORM = f"{reasoning_gym.PREFIX}<dataset>[?key=value&...]"


def task_names() -> list[str]:
    """The bundled task names (a reasoning-gym task is any ``reasoning_gym:<dataset>``), for help texts and errors."""
    return sorted([*_TASKS, *_TASKS_WITH_SETTINGS])


def task_name_pattern() -> str:
    """The form of the task names beyond :func:`task_names` (a bundled task with settings, a reasoning-gym dataset),
    for the JSON Schema; whether the settings or the dataset exist is checked on load."""
    with_settings = "|".join(sorted(_TASKS_WITH_SETTINGS))
    return rf"^({reasoning_gym.NAME_FORM}|({with_settings})\?.*)$"


def task_name_problem(name: str) -> str | None:
    """Why ``name`` names no task, or None: the one rule of ``data.task`` and ``data.tasks[].name`` (a bundled
    name, or a reasoning-gym dataset that exists, with config keys it has; the package installed)."""
    if reasoning_gym.is_reasoning_gym_name(name):
        return reasoning_gym.name_problem(name)
    if name in _TASKS:
        return None
    base, query = split_name(str(name))
    if base in _TASKS_WITH_SETTINGS:
        try:
            _task_with_settings(name)
        except UnknownTaskError as failure:
            return str(failure)
        return None
    if base in _TASKS:
        return _takes_no_settings(name, base)
    close = difflib.get_close_matches(str(name), task_names(), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"{name!r} is not one of: {', '.join(task_names())}, or {_REASONING_GYM_FORM}{hint}"


def get_task(name: str) -> Task:
    """Look up a task by name: a bundled one (``"digits"``) or ``reasoning_gym:<dataset>[?key=value&...]``."""
    if reasoning_gym.is_reasoning_gym_name(name):
        return _reasoning_gym_task(name)
    base = split_name(name)[0]
    if base in _TASKS_WITH_SETTINGS:
        return _task_with_settings(name)
    try:
        return _TASKS[name]
    except KeyError:
        if base in _TASKS:
            raise UnknownTaskError(_takes_no_settings(name, base)) from None
        raise UnknownTaskError(
            f"unknown task {name!r}; bundled tasks are: {', '.join(task_names())}; "
            f"or {_REASONING_GYM_FORM} ({reasoning_gym.INSTALL_HINT})"
        ) from None


def _takes_no_settings(name: str, base: str) -> str:
    return f"{name!r}: the {base} task takes no settings; write {base}"


@functools.lru_cache(maxsize=64)
def _task_with_settings(name: str) -> Task:
    base, query = split_name(name)
    return _TASKS_WITH_SETTINGS[base](name, parse_query(name, query))


@functools.lru_cache(maxsize=64)
def _reasoning_gym_task(name: str) -> Task:
    problem = reasoning_gym.name_problem(name)
    if problem is not None:
        raise UnknownTaskError(problem)
    spec = reasoning_gym.parse_name(name)
    return Task(
        name,
        functools.partial(reasoning_gym.make_prompts, spec),
        reasoning_gym.score,
        f"reasoning-gym {spec.dataset}: reward = its score_answer of the <answer> the response gives",
        functools.partial(reasoning_gym.make_demonstrations, spec),
    )


# ---------------------------------------------------------------------------------- data.tasks: a mixture
def _members(entries: Sequence[Any]) -> list[tuple[str, float]]:
    return [(str(entry["name"]), float(entry.get("weight", 1.0))) for entry in entries]


def mixture_problems(entries: Sequence[Any]) -> list[tuple[str, str]]:
    """``(key suffix, problem)`` per unusable ``data.tasks`` entry (``"[1].name"``, ...): each is a mapping
    ``{name, weight}`` naming a reasoning-gym task (their one reward scores every entry), weight > 0 (default 1)."""
    if not entries:
        return [("", "a mixture needs at least one task, e.g. [{name: reasoning_gym:leg_counting, weight: 1}]")]
    problems = []
    for index, entry in enumerate(entries):
        where = f"[{index}]"
        if not isinstance(entry, Mapping):
            problems.append((where, f"expected a mapping {{name: ..., weight: ...}}, got {entry!r}"))
            continue
        unknown = [key for key in entry if key not in ("name", "weight")]
        if unknown:
            problems.append((f"{where}.{unknown[0]}", f"unknown key {unknown[0]!r}; an entry has name and weight"))
        name, weight = entry.get("name"), entry.get("weight", 1.0)
        if not isinstance(name, str) or not name:
            problems.append((f"{where}.name", f"a task name is required, e.g. {reasoning_gym.PREFIX}leg_counting"))
        elif not reasoning_gym.is_reasoning_gym_name(name):
            problems.append((f"{where}.name", (
                f"{name!r} is not a reasoning-gym task; a mixture takes {_REASONING_GYM_FORM} tasks, whose one reward "
                "scores them all (a bundled task goes in data.task)"
            )))
        else:
            problem = task_name_problem(name)
            if problem is not None:
                problems.append((f"{where}.name", problem))
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0 or weight == float("inf"):
            problems.append((f"{where}.weight", f"must be a positive number, got {weight!r}"))
    return problems


def mixture_task(entries: Sequence[Any]) -> Task:
    """The task of a ``data.tasks`` mixture: prompts (and demonstrations) drawn by weight, one reward for all."""
    problems = mixture_problems(entries)
    if problems:
        where, problem = problems[0]
        raise UnknownTaskError(f"data.tasks{where}: {problem}")
    members = _members(entries)
    tasks = [get_task(name) for name, _ in members]
    weights = [weight for _, weight in members]

    def make_prompts(num: int, seed: int) -> list[dict[str, Any]]:
        return mixture.interleave([task.make_prompts for task in tasks], weights, num, seed)

    def make_demonstrations(num: int, seed: int) -> list[dict[str, Any]]:
        return mixture.interleave([task.make_demonstrations for task in tasks], weights, num, seed)  # type: ignore[misc]

    name = " + ".join(f"{task_name} (weight {weight:g})" for task_name, weight in members)
    return Task(name, make_prompts, reasoning_gym.score, "a weighted mixture of reasoning-gym tasks", make_demonstrations)


def data_task(data: Any) -> Task | None:
    """The task a ``data`` section generates prompts from: ``data.tasks``' mixture, else ``data.task``, else None."""
    if data.get("tasks"):
        return mixture_task(list(data.get("tasks")))
    if data.get("task"):
        return get_task(str(data.get("task")))
    return None
