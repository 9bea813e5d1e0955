"""The endpoint's settings, read once: ``rollout.agent_server`` and the ``rollout.multi_turn`` budgets it keeps.

A program's trajectory has the token budget of any agent trajectory: ``rollout.multi_turn.max_turns`` sampling
requests and ``rollout.multi_turn.max_response_tokens`` tokens after the prompt, each request at most
``rollout.max_new_tokens`` new tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlhfctl.recipe.schema import AgentServerConfig, defaults_of, nullable_keys

__all__ = ["MODEL_NAME", "EndpointSettings", "endpoint_settings"]

MODEL_NAME = "policy"
"""The one model the endpoint serves (``GET /v1/models``); requests may name any model, they get the policy."""


@dataclass(frozen=True)
class EndpointSettings:
    """``rollout.agent_server`` with its defaults, and the trajectory budget from ``rollout.multi_turn``."""

    program: str
    max_concurrency: int
    request_timeout_s: float
    trajectory_timeout_s: float
    queue_size: int
    batch_wait_s: float
    port_range: tuple[int, int] | None
    tool_format: str
    max_turns: int
    """Sampling requests per trajectory at most (``rollout.multi_turn.max_turns``)."""
    max_response_tokens: int
    """Tokens of a trajectory after its prompt (``rollout.multi_turn.max_response_tokens``)."""
    max_new_tokens: int
    """New tokens of one request at most (``rollout.max_new_tokens``)."""


def endpoint_settings(agent_server: Mapping[str, Any] | None, multi_turn: Mapping[str, Any], max_new_tokens: int) -> EndpointSettings | None:
    """The settings of ``rollout.agent_server`` (None when it names no program); ``multi_turn`` is
    ``rollout.multi_turn`` with its defaults filled in."""
    defaults, nullable = defaults_of(AgentServerConfig), nullable_keys(AgentServerConfig)
    given = dict(agent_server or {})
    values = {**defaults, **{key: value for key, value in given.items() if value is not None or key in nullable}}
    if not values["program"]:
        return None
    ports = values["port_range"]
    return EndpointSettings(
        program=str(values["program"]),
        max_concurrency=int(values["max_concurrency"]),
        request_timeout_s=float(values["request_timeout_s"]),
        trajectory_timeout_s=float(values["trajectory_timeout_s"]),
        queue_size=int(values["queue_size"]),
        batch_wait_s=float(values["batch_wait_s"]),
        port_range=None if ports is None else (int(ports[0]), int(ports[1])),
        tool_format=str(values["tool_format"]),
        max_turns=int(multi_turn["max_turns"]),
        max_response_tokens=int(multi_turn["max_response_tokens"]),
        max_new_tokens=int(max_new_tokens),
    )
