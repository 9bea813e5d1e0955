"""The agent loops: how one sample becomes a :class:`~rlhfctl.agents.trajectory.Trajectory`.

An :class:`AgentLoop` is built once per rollout with the :class:`AgentContext` (tokenizer, chat turns,
tools or environment, the ``rollout.multi_turn`` settings) and runs each sample with
``await loop.run(sample, llm)``; every trajectory of the step is in flight at once, so ``run`` must
never block the event loop (run blocking work with ``asyncio.to_thread``).

- :class:`ToolAgentLoop` (the default): generate a turn; parse its tool calls
  (``rollout.multi_turn.format``); run them concurrently, each under ``tool_timeout_s``; append their
  outputs as tool turns (mask 0); repeat until a turn calls no tool, ``max_turns`` or the token budget.
- :class:`EnvironmentAgentLoop` (with ``rollout.multi_turn.environment``): each turn is an action
  passed to ``Environment.step``; its observation goes in as a user turn (mask 0).
- :class:`~rlhfctl.agents.endpoint.EndpointAgentLoop` (with ``rollout.agent_server.program``): each sample is
  one run of an agent program against an OpenAI-compatible endpoint on the rank; the trajectory is the tokens
  its requests recorded (``rlhfctl/agents/endpoint/``; importable from here too).

A problem in the model's call (malformed JSON, an unknown tool, arguments failing the tool's schema)
or in the tool (it raises, it times out) never ends the step: the model reads it as the tool's
output, and it counts in ``agent/tool_errors``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlhfctl.agents.chat_turns import ChatTurns
from rlhfctl.agents.llm import Generation
from rlhfctl.agents.tool import ToolResult
from rlhfctl.agents.tool_calls import ToolCall, argument_problem, tool_call_parser
from rlhfctl.agents.trajectory import Trajectory

__all__ = ["AgentContext", "AgentLoop", "AgentSample", "EnvironmentAgentLoop", "ToolAgentLoop"]


def __getattr__(name: str) -> Any:
    """``EndpointAgentLoop``, imported on first use (its package builds on this module)."""
    if name == "EndpointAgentLoop":
        from rlhfctl.agents.endpoint.loop import EndpointAgentLoop  # lazily: the endpoint package imports this module

        return EndpointAgentLoop
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class AgentContext:
    """What every loop of a rollout shares."""

    tokenizer: Any
    chat: ChatTurns
    eos_ids: list[int]
    settings: Mapping[str, Any]
    """``rollout.multi_turn`` (max_turns, max_response_tokens, max_tool_response_tokens, tool_timeout_s, format)."""
    max_new_tokens: int
    """Tokens one assistant turn may generate (``rollout.max_new_tokens``)."""
    tools: Mapping[str, Any] = field(default_factory=dict)
    environment: tuple[type, dict[str, Any]] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    """Passed to every ``llm.generate`` call."""

    @property
    def max_turns(self) -> int:
        return int(self.settings["max_turns"])

    @property
    def timeout_s(self) -> float:
        return float(self.settings["tool_timeout_s"])

    def decode(self, token_ids: list[int]) -> str:
        """An assistant turn's text: its tokens decoded without special tokens (tool-call tags such as
        Qwen's ``<tool_call>`` are added tokens that are not special, so they stay)."""
        kept = [token for token in token_ids if token not in self.eos_ids]
        return self.tokenizer.decode(kept, skip_special_tokens=True)


@dataclass(frozen=True)
class AgentSample:
    """One trajectory to run: the prompt's tokens, the sample's dataset columns, its instance id."""

    prompt_ids: list[int]
    columns: Mapping[str, Any]
    instance_id: str


class AgentLoop:
    """Base class: override :meth:`run`. ``self.context`` holds the tokenizer, the tools and the settings."""

    def __init__(self, context: AgentContext) -> None:
        self.context = context

    def new_trajectory(self, sample: AgentSample) -> Trajectory:
        """An empty trajectory for ``sample`` with the recipe's token budget."""
        return Trajectory(prompt_ids=list(sample.prompt_ids), budget=int(self.context.settings["max_response_tokens"]))

    async def generate_turn(self, trajectory: Trajectory, llm: Any) -> Generation:
        """One assistant turn from everything so far, appended to ``trajectory`` as generated (mask 1)."""
        budget = min(self.context.max_new_tokens, trajectory.budget_left)
        generation = await llm.generate(trajectory.context_ids, max_tokens=budget, **self.context.sampling)
        trajectory.append_generated(generation.token_ids, generation.log_probs)
        trajectory.num_turns += 1
        return generation

    def append_turns(self, trajectory: Trajectory, messages: list[dict[str, Any]], generation: Generation) -> bool:
        """Append ``messages`` (tool or user turns) in the chat wrapper with the next generation header (mask 0);
        False, and the trajectory truncated, when they do not fit the budget."""
        last = generation.token_ids[-1] if generation.token_ids and generation.finished else None
        if not trajectory.append_context(self.context.chat.token_ids(messages, last)):
            return False
        trajectory.messages.extend(messages)
        return True

    async def run(self, sample: AgentSample, llm: Any) -> Trajectory:
        """Roll out one sample."""
        raise NotImplementedError(f"{type(self).__name__}.run")


class ToolAgentLoop(AgentLoop):
    """The tool-calling loop (hermes tool calls by default)."""

    async def run(self, sample: AgentSample, llm: Any) -> Trajectory:
        """Turns until one calls no tool, ``max_turns`` or the token budget; every tool gets create/release."""
        context = self.context
        trajectory = self.new_trajectory(sample)
        trajectory.reward_extra["tool_rewards"] = 0.0
        parse = tool_call_parser(str(context.settings["format"]))
        tools = dict(context.tools)
        await asyncio.gather(*(tool.create(sample.instance_id, **sample.columns) for tool in tools.values()))
        try:
            for turn in range(context.max_turns):
                generation = await self.generate_turn(trajectory, llm)
                parsed = parse(context.decode(generation.token_ids))
                message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
                if parsed.calls:
                    message["tool_calls"] = [call.as_message() for call in parsed.calls]
                trajectory.messages.append(message)
                if not parsed.calls:
                    trajectory.truncated = trajectory.truncated or not generation.finished
                    break
                if turn == context.max_turns - 1 or trajectory.budget_left <= 0:
                    trajectory.truncated = True  # calls made, but no turn left to read their outputs
                    break
                results = await asyncio.gather(*(self.call_tool(call, sample.instance_id, trajectory) for call in parsed.calls))
                outputs = [
                    {"role": "tool", "name": call.name, "content": context.chat.cut(text, int(context.settings["max_tool_response_tokens"]))}
                    for call, text in zip(parsed.calls, results)
                ]
                if not self.append_turns(trajectory, outputs, generation):
                    break
        finally:
            await asyncio.gather(*(tool.release(sample.instance_id) for tool in tools.values()), return_exceptions=True)
        return trajectory

    async def call_tool(self, call: ToolCall, instance_id: str, trajectory: Trajectory) -> str:
        """The text the model reads back for one call; problems become an ``Error: ...`` text and a tool error."""
        trajectory.tool_calls += 1
        tool = self.context.tools.get(call.name)
        problem = call.error
        if problem is None and tool is None:
            problem = f"unknown tool {call.name!r}; the tools are: {', '.join(sorted(self.context.tools)) or 'none'}"
        if problem is None:
            problem = argument_problem(tool.schema, call.arguments)
            problem = f"invalid arguments for {call.name!r}: {problem}" if problem else None
        if problem is not None:
            trajectory.tool_errors += 1
            return f"Error: {problem}"
        start, wall = time.perf_counter(), time.time()
        try:
            result = await asyncio.wait_for(tool.execute(instance_id, call.arguments), self.context.timeout_s)
        except asyncio.TimeoutError:
            trajectory.tool_errors += 1
            return f"Error: {call.name!r} timed out after {self.context.timeout_s:g} s"
        except Exception as error:  # the tool's own failure: the model reads it, the step goes on
            trajectory.tool_errors += 1
            return f"Error: {call.name!r} raised {type(error).__name__}: {error}"
        finally:
            trajectory.tool_latency_s += time.perf_counter() - start
            trajectory.spans.append((f"agent.tool.{call.name}", wall, time.time()))
        if not isinstance(result, ToolResult):
            result = ToolResult(text=str(result))
        trajectory.reward_extra["tool_rewards"] = trajectory.tool_rewards + float(result.reward)
        for key, value in dict(result.metrics).items():
            trajectory.tool_metrics.setdefault(f"{call.name}/{key}", []).append(float(value))
        return result.text


class EnvironmentAgentLoop(AgentLoop):
    """Each assistant turn is an action; ``Environment.step``'s observation comes back as a user turn."""

    async def run(self, sample: AgentSample, llm: Any) -> Trajectory:
        """``reset``, then turns until ``done``, ``max_turns`` or the token budget; ``close`` whatever happens."""
        context = self.context
        if context.environment is None:
            raise ValueError("EnvironmentAgentLoop needs rollout.multi_turn.environment")
        cls, config = context.environment
        environment = cls(**config)
        trajectory = self.new_trajectory(sample)
        trajectory.reward_extra["tool_rewards"] = 0.0
        try:
            first = await environment.reset(**sample.columns)
            if first and not trajectory.append_context(context.tokenizer.encode(first, add_special_tokens=False)):
                return trajectory
            if first:
                trajectory.messages.append({"role": "user", "content": first})
            for turn in range(context.max_turns):
                generation = await self.generate_turn(trajectory, llm)
                action = context.decode(generation.token_ids)
                trajectory.messages.append({"role": "assistant", "content": action})
                observation, reward, done = await self._step(environment, action, trajectory)
                trajectory.reward_extra["tool_rewards"] = trajectory.tool_rewards + float(reward)
                if done:
                    break
                if turn == context.max_turns - 1 or trajectory.budget_left <= 0:
                    trajectory.truncated = True
                    break
                text = context.chat.cut(observation, int(context.settings["max_tool_response_tokens"]))
                if not self.append_turns(trajectory, [{"role": "user", "content": text}], generation):
                    break
        finally:
            await asyncio.gather(environment.close(), return_exceptions=True)
        return trajectory

    async def _step(self, environment: Any, action: str, trajectory: Trajectory) -> tuple[str, float, bool]:
        trajectory.tool_calls += 1
        start, wall = time.perf_counter(), time.time()
        try:
            observation, reward, done = await asyncio.wait_for(environment.step(action), self.context.timeout_s)
            return str(observation), float(reward), bool(done)
        except asyncio.TimeoutError:
            trajectory.tool_errors += 1
            return f"Error: the environment's step timed out after {self.context.timeout_s:g} s", 0.0, False
        except Exception as error:
            trajectory.tool_errors += 1
            return f"Error: the environment's step raised {type(error).__name__}: {error}", 0.0, False
        finally:
            trajectory.tool_latency_s += time.perf_counter() - start
            trajectory.spans.append(("agent.environment.step", wall, time.time()))
