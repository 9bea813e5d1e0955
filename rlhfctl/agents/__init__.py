"""Agent rollouts: the policy calls tools, or acts in an environment, over several turns (docs/agents.md).

What a user writes: a :class:`Tool` (returning a :class:`ToolResult`), an :class:`Environment`, or a whole
:class:`AgentLoop` whose ``run(sample, llm)`` returns a :class:`Trajectory`. The names are imported on
first use, so ``import rlhfctl.agents`` stays light.
"""

from __future__ import annotations

from rlhfctl.lazy_exports import lazy_exports

__all__ = [
    "AgentContext",
    "AgentLoop",
    "AgentSample",
    "Environment",
    "Generation",
    "Tool",
    "ToolAgentLoop",
    "ToolCall",
    "ToolResult",
    "Trajectory",
    "register_tool_call_parser",
]

__getattr__ = lazy_exports(
    __name__,
    {
        "Tool": "rlhfctl.agents.tool",
        "ToolResult": "rlhfctl.agents.tool",
        "Environment": "rlhfctl.agents.environment",
        "AgentContext": "rlhfctl.agents.loop",
        "AgentLoop": "rlhfctl.agents.loop",
        "AgentSample": "rlhfctl.agents.loop",
        "ToolAgentLoop": "rlhfctl.agents.loop",
        "Trajectory": "rlhfctl.agents.trajectory",
        "Generation": "rlhfctl.agents.llm",
        "ToolCall": "rlhfctl.agents.tool_calls",
        "register_tool_call_parser": "rlhfctl.agents.tool_calls",
    },
)
