"""Validation of the python tool's sandbox: the kernel lets it build its namespace boundary, or the recipe opts
out with ``allow_unconfined`` (exit 2 from ``validate`` and ``train``, naming that key, before any worker starts).
The same for the code-execution reward (``roles.reward.function: rlhfctl.rewards:code``), which runs its tests
in that sandbox and opts out with ``roles.reward.function_kwargs.allow_unconfined``.

The probe runs the tool's real launcher once on *this* host, the driver's. Workers on other hosts check again
when they build the tool, and refuse to start with the same message (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from rlhfctl.recipe.errors import Issue, RecipeError, error, warning
from rlhfctl.recipe.specs import Recipe

__all__ = ["check_sandbox"]

_KEY = "rollout.multi_turn"
CODE_REWARDS = ("rlhfctl.rewards:code", "rlhfctl.rewards.code_execution:code", "rlhfctl.tasks.code_echo:score")
"""The specs of the code-execution reward."""


def check_sandbox(recipe: Recipe) -> list[Issue]:
    """An error at ``...tools[i].config.allow_unconfined`` for each python tool this host cannot confine, unless
    set true (then a warning); nothing for other tools, or a tool whose class is wrong (check_agents says so)."""
    # the agents package, off the CLI's path without tools
    from rlhfctl.agents.tool_registry import tool_class
    from rlhfctl.agents.tools.python_sandbox import PythonSandbox, boundary_refusal, refusal_message

    issues: list[Issue] = []
    tools = recipe.rollout.multi_turn.tools if recipe.rollout.agent else []
    for index, entry in enumerate(tools):
        key = f"{_KEY}.tools[{index}]"
        try:
            cls, config = tool_class(entry, key)
        except RecipeError:
            continue
        if not (isinstance(cls, type) and issubclass(cls, PythonSandbox)) or not isinstance(config, Mapping):
            continue
        why = boundary_refusal(bool(config.get("isolate_network", True)))
        if not why:
            continue
        if config.get("allow_unconfined"):
            issues.append(warning(f"{key}.config.allow_unconfined", (
                f"{key}.config.allow_unconfined: this host refuses the python tool's sandbox ({why}), so the model's "
                "code will run with resource limits only: it can read your files and outlive its call")))
        else:
            issues.append(error(f"{key}.config.allow_unconfined", (
                f"{key}.config.allow_unconfined: {refusal_message(why, key)}; checked on the driver's host")))
    return issues + _check_code_reward(recipe)


def _check_code_reward(recipe: Recipe) -> list[Issue]:
    """The code-execution reward's sandbox: an error at ``roles.reward.function_kwargs.allow_unconfined`` where
    this host refuses it and the recipe does not opt out (then a warning)."""
    reward = recipe.section_of("reward")
    if reward is None or str(reward.get("function") or "").replace(" ", "") not in CODE_REWARDS:
        return []
    from rlhfctl.rewards.code_execution import refusal_problem  # the agents package, only for this reward

    kwargs = reward.get("function_kwargs") or {}
    key = "roles.reward.function_kwargs.allow_unconfined"
    if kwargs.get("allow_unconfined") is True:
        from rlhfctl.agents.tools.python_sandbox import boundary_refusal

        why = boundary_refusal(True)
        return [warning(key, (
            f"{key}: this host refuses the sandbox ({why}), so the tests of rlhfctl.rewards:code run the model's code "
            "with resource limits only: it can read your files and outlive its test"))] if why else []
    problem = refusal_problem(False)
    return [error(key, f"{key}: {problem}; checked on the driver's host")] if problem else []
