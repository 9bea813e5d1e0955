"""Validate's look at what the reward function returns: the named scores a recipe asks for, and the math checker.

A recipe may name scores that only the reward function's return value shows: ``algorithm.gdpo_reward_keys``
and a named ``algorithm.filter_groups.metric``. The signature cannot tell them, so validate calls the
function once, as the reward worker would, on the first training record with its ground truth as the
response (an empty response without one), and reads the names of the dict it returns. Reward functions
are expected to be pure functions of their inputs; one that raises on this probe gets a warning, not an
error.
"""

from __future__ import annotations

from typing import Any, Callable

from rlhfctl.data.verl_layout import reward_columns
from rlhfctl.recipe.errors import Issue, error, warning
from rlhfctl.recipe.specs import Recipe
from rlhfctl.rewards import math_backend
from rlhfctl.rewards.functions import (
    RewardFunctionError, call_reward_function, is_internal_column, load_reward_function,
)
from rlhfctl.tasks import get_task

__all__ = ["first_training_record", "named_reward_problems", "requested_names", "reward_notes"]

_MATH_REWARDS = ("math", "dispatch_by_source")


def requested_names(cfg: Any) -> dict[str, list[str]]:
    """Recipe key -> the named scores it needs from the reward function."""
    from rlhfctl.trainer.sample_metric import BUILT_IN_METRICS  # pulls in torch: only when the names are read

    wanted: dict[str, list[str]] = {}
    algo = cfg.algorithm
    if str(algo.adv_estimator) == "gdpo" and algo.gdpo_reward_keys:
        wanted["algorithm.gdpo_reward_keys"] = [str(name) for name in algo.gdpo_reward_keys]
    metric = str(algo.filter_groups.metric)
    if algo.filter_groups.enable and metric not in BUILT_IN_METRICS:
        wanted["algorithm.filter_groups.metric"] = [metric]
    return wanted


def named_reward_problems(cfg: Any, function: Callable[..., Any], record: dict[str, Any] | None,
                          prompt_key: str) -> list[Issue]:
    """An error per requested name the function does not return on the probe (see the module doc)."""
    wanted = requested_names(cfg)
    if not wanted or record is None:
        return []
    spec = str(cfg.roles.reward.function)
    try:
        returned = set(_probe(cfg, function, record, prompt_key))
    except Exception as failure:  # user code: any failure is only a reason we could not look
        keys = ", ".join(wanted)
        return [warning(next(iter(wanted)), (
            f"{keys}: could not check that {spec} returns {_names(wanted)}: calling it on the first training record "
            f"raised {type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"
        ))]
    issues = []
    for key, names in wanted.items():
        missing = [name for name in names if name not in returned]
        if missing:
            gives = ", ".join(sorted(returned)) or "no named scores (it returns plain floats)"
            issues.append(error(key, (
                f"{key}: the reward function {spec} does not return {', '.join(map(repr, missing))}; it returns {gives}. "
                "Return a dict per sample with those entries (rlhfctl.rewards:combined builds one from several rewards)"
            )))
    return issues


def reward_notes(recipe: Recipe) -> list[str]:
    """What validate says about the reward: for the bundled math rewards, the answer checker in use."""
    spec = recipe.roles.get("reward")
    if spec is None or not spec.settings.function:
        return []
    reward = spec.settings
    try:
        function = load_reward_function(str(reward.function))
    except (RewardFunctionError, SystemExit):
        return []  # preflight reports it
    if getattr(function, "__module__", "").split(".")[:2] != ["rlhfctl", "rewards"]:
        return []
    if getattr(function, "__name__", "") not in _MATH_REWARDS:
        return []
    checker = str(reward.function_kwargs.get("checker", "auto"))
    backend = math_backend(checker)
    hint = "" if backend.startswith("math-verify") else " (pip install 'rlhfctl[math]' for math-verify)"
    return [f"roles.reward.function: {reward.function} checks answers with {backend}{hint}"]


def first_training_record(cfg: Any) -> dict[str, Any] | None:
    """The first record of ``data.train_files`` (or of the bundled task), or None when it cannot be read."""
    from rlhfctl.data import DataFileError, load_records  # pulls in torch: only when a record is read

    files = cfg.data.get("train_files")
    try:
        if files:
            files = [files] if isinstance(files, str) else list(files)
            return load_records(str(files[0]), limit=1)[0]
        if cfg.data.get("task"):
            return get_task(str(cfg.data.task)).make_prompts(1, int(cfg.trainer.seed))[0]
    except (DataFileError, Exception):  # validate's data checks report unreadable data
        return None
    return None


def _probe(cfg: Any, function: Callable[..., Any], record: dict[str, Any], prompt_key: str) -> list[str]:
    columns = {name: [value] for name, value in reward_columns(record, prompt_key).items() if not is_internal_column(name)}
    truth = columns.get("ground_truth", [None])[0]
    prompt = record.get(prompt_key)
    result = call_reward_function(
        function, str(cfg.roles.reward.function), [prompt if isinstance(prompt, str) else str(prompt)],
        ["" if truth is None else str(truth)], columns,
        kwargs=dict(cfg.roles.reward.function_kwargs),
    )
    return list(result.named)


def _names(wanted: dict[str, list[str]]) -> str:
    return ", ".join(repr(name) for names in wanted.values() for name in names)
