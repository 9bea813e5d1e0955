"""What a user writes to give the policy a tool: a :class:`Tool` subclass, and the :class:`ToolResult` it returns.

A tool is constructed once per rollout worker with its recipe ``config``
(``rollout.multi_turn.tools: [{class: module:Class, config: {...}}]``). Each trajectory gets its own
instance id: ``create`` is called with the sample's dataset columns before the first turn (so a tool
may hold per-sample state: a sandbox, a database, the ground truth), ``execute`` for every call the
model makes, and ``release`` when the trajectory ends, whatever the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

__all__ = ["Tool", "ToolResult"]


@dataclass(frozen=True)
class ToolResult:
    """What one tool call gives back: the text the model reads next, and an optional reward and metrics."""

    text: str
    reward: float = 0.0
    """Summed over a trajectory's calls into ``tool_rewards``, which a reward function may take."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Numbers logged as ``agent/tool/<name>/<key>/mean``."""


class Tool:
    """Base class of a tool the policy can call; subclasses set ``name`` and ``schema`` and override ``execute``.

    ``schema`` is an OpenAI function schema:
    ``{"type": "function", "function": {"name": ..., "description": ..., "parameters": {JSON schema}}}``;
    the chat template shows it to the model, and arguments that fail its ``parameters`` never reach
    ``execute`` (the model is told what was wrong instead).
    """

    name: ClassVar[str] = ""
    schema: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, **config: Any) -> None:
        self.config = dict(config)

    async def create(self, instance_id: str, **columns: Any) -> None:
        """Set up per-trajectory state from the sample's dataset columns (nothing by default)."""

    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run one call with the model's (schema-checked) arguments."""
        raise NotImplementedError(f"{type(self).__name__}.execute")

    async def release(self, instance_id: str) -> None:
        """Free per-trajectory state (nothing by default)."""
