"""Validation of ``rollout.multi_turn``: the tools, the environment and the agent loop import and are usable,
and the tool-call format has a parser, before any worker starts (exit 2 from ``validate`` and ``train``).

The checks build nothing: they import the classes and read their schemas through the same functions the
workers use (``rlhfctl/agents/tool_registry.py``), so both report the same key, e.g.
``rollout.multi_turn.tools[1].class``.
"""

from __future__ import annotations

from rlhfctl.recipe.errors import Issue, RecipeError, did_you_mean, error, warning
from rlhfctl.recipe.specs import Recipe

__all__ = ["check_agents"]

_KEY = "rollout.multi_turn"


def check_agents(recipe: Recipe) -> list[Issue]:
    """Errors naming the key of each tool, environment or loop class that does not import or is unusable, and
    of an unknown ``format``; nothing when ``rollout.multi_turn.enable`` is off."""
    if not recipe.rollout.agent:
        return []
    # the agents package: imported only for agent rollouts, off the CLI's path otherwise
    from rlhfctl.agents.tool_calls import tool_call_parsers
    from rlhfctl.agents.tool_registry import agent_loop_class, environment_spec, tool_class, tool_classes

    multi_turn = recipe.rollout.multi_turn

    issues: list[Issue] = []
    for index, entry in enumerate(multi_turn.tools):  # one issue per tool, not just the first
        try:
            tool_class(entry, f"{_KEY}.tools[{index}]")
        except RecipeError as problem:
            issues.append(error(problem.key_path, str(problem)))
    if not issues:
        try:
            tool_classes(multi_turn)  # names unique across tools
        except RecipeError as problem:
            issues.append(error(problem.key_path, str(problem)))
    for check in (environment_spec, agent_loop_class):
        try:
            check(multi_turn)
        except RecipeError as problem:
            issues.append(error(problem.key_path, str(problem)))
    fmt = str(multi_turn.format)
    if fmt not in tool_call_parsers():  # after the tools' imports, which may register a parser
        issues.append(error(f"{_KEY}.format", (
            f"{_KEY}.format: no tool-call parser {fmt!r} (registered: {', '.join(tool_call_parsers())}){did_you_mean(fmt, tool_call_parsers())}; "
            "register one with rlhfctl.agents.register_tool_call_parser in a module your tools import"
        )))
    if multi_turn.environment and multi_turn.tools and not multi_turn.agent_loop:
        issues.append(warning(f"{_KEY}.tools", (
            f"{_KEY}.tools: with an environment the default loop steps the environment and calls no tool; "
            "drop the tools or write an agent_loop that uses both"
        )))
    return issues

