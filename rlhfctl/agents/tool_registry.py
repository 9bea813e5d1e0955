"""The recipe's ``rollout.multi_turn`` turned into objects: the tools, the environment class, the loop class.

Every problem is a :class:`~rlhfctl.recipe.errors.RecipeError` naming its key
(``rollout.multi_turn.tools[1].class``), so ``validate`` (``rlhfctl/recipe/check_agents.py``) and the
workers report the same thing; ``validate`` runs these before any worker starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlhfctl.agents.environment import Environment
from rlhfctl.agents.loop import AgentLoop, EnvironmentAgentLoop, ToolAgentLoop
from rlhfctl.agents.tool import Tool
from rlhfctl.agents.tool_calls import schema_problem
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.importing import import_class

__all__ = ["agent_loop_class", "build_tools", "environment_spec", "tool_class", "tool_classes"]

_KEY = "rollout.multi_turn"


def _spec(entry: Any, key: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("class"), str) or not entry.get("class"):
        raise RecipeError(f"{key}: expected {{class: module:Class, config: {{...}}}}, got {entry!r}", f"{key}.class", "invalid")
    config = entry.get("config") or {}
    if not isinstance(config, Mapping):
        raise RecipeError(f"{key}.config: expected a mapping of keyword arguments, got {config!r}", f"{key}.config", "wrong_type")
    return str(entry["class"]), dict(config)


def tool_class(entry: Any, key: str) -> tuple[type, dict[str, Any]]:
    """One tool's ``(class, config)``: the class imported, a :class:`~rlhfctl.agents.Tool` with a usable schema."""
    ref, config = _spec(entry, key)
    cls = import_class(ref, f"{key}.class")
    if not issubclass(cls, Tool):
        raise RecipeError(f"{key}.class: {ref!r} is not a subclass of rlhfctl.agents.Tool", f"{key}.class", "invalid")
    problem = schema_problem(cls.schema)
    if problem:
        raise RecipeError(f"{key}.class: {ref!r} has an unusable schema: {problem}", f"{key}.class", "invalid")
    name = str(cls.schema["function"]["name"])
    if cls.name and cls.name != name:
        raise RecipeError(
            f"{key}.class: {ref!r} is named {cls.name!r} but its schema's function is {name!r}; make them one",
            f"{key}.class", "invalid",
        )
    return cls, config


def tool_classes(multi_turn: Mapping[str, Any]) -> list[tuple[type, dict[str, Any], str]]:
    """``(class, config, key path)`` of each tool (:func:`tool_class`), their names unique."""
    found, names = [], {}
    for index, entry in enumerate(multi_turn.get("tools") or []):
        key = f"{_KEY}.tools[{index}]"
        cls, config = tool_class(entry, key)
        name = str(cls.schema["function"]["name"])
        if name in names:
            raise RecipeError(f"{key}.class: a second tool named {name!r} (the first is {names[name]})", f"{key}.class", "invalid")
        names[name] = key
        found.append((cls, config, key))
    return found


def chat_tools(multi_turn: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The tools' function schemas for the chat template (``tools=``), so the model is told what it may call;
    None without agent rollouts or tools."""
    if not multi_turn.get("enable") or not multi_turn.get("tools"):
        return None
    return [dict(cls.schema) for cls, _, _ in tool_classes(multi_turn)]


def build_tools(multi_turn: Mapping[str, Any]) -> dict[str, Any]:
    """Tool name -> the tool, each built once with its ``config``."""
    tools = {}
    for cls, config, key in tool_classes(multi_turn):
        try:
            tool = cls(**config)
        except Exception as error:
            raise RecipeError(f"{key}.config: building {cls.__name__} failed: {type(error).__name__}: {error}", f"{key}.config", "invalid") from error
        tools[str(cls.schema["function"]["name"])] = tool
    return tools


def environment_spec(multi_turn: Mapping[str, Any]) -> tuple[type, dict[str, Any]] | None:
    """The environment's class and config, or None without one."""
    entry = multi_turn.get("environment")
    if not entry:
        return None
    key = f"{_KEY}.environment"
    ref, config = _spec(entry, key)
    cls = import_class(ref, f"{key}.class")
    if not issubclass(cls, Environment):
        raise RecipeError(f"{key}.class: {ref!r} is not a subclass of rlhfctl.agents.Environment", f"{key}.class", "invalid")
    return cls, config


def agent_loop_class(multi_turn: Mapping[str, Any]) -> type:
    """``agent_loop`` imported, else the environment loop with an environment, else the tool-calling loop."""
    ref = multi_turn.get("agent_loop")
    if ref:
        key = f"{_KEY}.agent_loop"
        cls = import_class(str(ref), key)
        if not issubclass(cls, AgentLoop):
            raise RecipeError(f"{key}: {ref!r} is not a subclass of rlhfctl.agents.AgentLoop", key, "invalid")
        return cls
    return EnvironmentAgentLoop if multi_turn.get("environment") else ToolAgentLoop
