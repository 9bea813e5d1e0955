"""Validation of the python tool's sandbox: the kernel lets it build its namespace boundary, or the recipe opts
out with ``allow_unconfined`` (exit 2 from ``validate`` and ``train``, naming that key, before any worker starts).

The probe runs the tool's real launcher once on *this* host, the driver's. Workers on other hosts check again
when they build the tool, and refuse to start with the same message (docs/security.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from rlhfctl.recipe.errors import Issue, RecipeError, error, warning
from rlhfctl.recipe.specs import Recipe

__all__ = ["check_sandbox"]

_KEY = "rollout.multi_turn"


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
    return issues
