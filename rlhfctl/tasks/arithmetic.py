"""The bundled "arithmetic" task: multiplications a tiny model cannot do alone, but can with the calculator tool.

Prompts are ``"47*83="`` (two 2-digit numbers) with ``ground_truth`` the product, ``"3901"``. A tiny
random model (the quickstart's qwen2, hidden 64, 2 layers) cannot multiply, so answering directly
scores near 0; what it can learn is to copy the numbers into a calculator call and copy the tool's
answer back. The demonstrations (:func:`make_demonstrations`, sft) show exactly that chat::

    user:      47*83=
    assistant: <tool_call>{"name":"calculator","arguments":{"expression":"47*83"}}</tool_call>
    tool:      3901
    assistant: 3901

The call is the hermes format the agent loop parses (:mod:`rlhfctl.agents.tool_calls`), written in the
assistant's content (compact JSON: every character is a token), so SFT teaches the very tokens an agent
rollout generates; the tool turn holds the bundled Calculator's own output. :func:`score` is 1.0 when
the final answer equals the product.

:func:`make_direct_demonstrations` (task ``arithmetic-direct``) answers the same prompts without the
tool (``"47*83="`` -> ``"3901"``): the baseline of the model alone.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

from rlhfctl.agents.tools.calculator import Calculator, evaluate, format_number
from rlhfctl.tasks.reward_fn import check_reward_inputs

__all__ = ["final_answer", "make_demonstrations", "make_direct_demonstrations", "make_prompts", "score", "tool_call"]

LOW, HIGH = 10, 99
"""Both factors are drawn from ``LOW..HIGH`` (2-digit numbers)."""


def _check(num: int) -> None:
    if num < 0:
        raise ValueError(f"num must be a non-negative number of records, got {num}")


def _factors(num: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(f"{seed}:arithmetic")
    return [(rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)) for _ in range(num)]


def make_prompts(num: int, seed: int) -> list[dict[str, str]]:
    """``num`` records ``{"prompt": "47*83=", "ground_truth": "3901"}``, the same for a seed."""
    _check(num)
    return [{"prompt": f"{a}*{b}=", "ground_truth": str(a * b)} for a, b in _factors(num, seed)]


def tool_call(expression: str) -> str:
    """The hermes call of the calculator on ``expression``, in compact JSON (what the policy learns to write)."""
    body = json.dumps({"name": Calculator.name, "arguments": {"expression": expression}}, separators=(",", ":"))
    return f"<tool_call>{body}</tool_call>"


def _calculator_output(expression: str) -> str:
    """The text the bundled Calculator returns for ``expression`` (its defaults), as the model reads it."""
    defaults = Calculator.defaults
    return format_number(evaluate(expression, max_exponent=int(defaults["max_exponent"]), max_abs=float(defaults["max_abs"])))


def make_demonstrations(num: int, seed: int) -> list[dict[str, Any]]:
    """``num`` tool-use chats ``{"messages", "tools", "ground_truth"}`` on :func:`make_prompts`' prompts."""
    records = []
    for record in make_prompts(num, seed):
        expression = record["prompt"].rstrip("=")
        output = _calculator_output(expression)
        messages = [
            {"role": "user", "content": record["prompt"]},
            {"role": "assistant", "content": tool_call(expression)},
            {"role": "tool", "name": Calculator.name, "content": output},
            {"role": "assistant", "content": output},
        ]
        records.append({"messages": messages, "tools": [dict(Calculator.schema)], "ground_truth": record["ground_truth"]})
    return records


def make_direct_demonstrations(num: int, seed: int) -> list[dict[str, Any]]:
    """``num`` chats answering without the tool: ``"47*83="`` -> ``"3901"`` (the model-alone baseline)."""
    return [
        {"messages": [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["ground_truth"]}],
         "ground_truth": record["ground_truth"]}
        for record in make_prompts(num, seed)
    ]


def final_answer(response: str, messages: Sequence[Mapping[str, Any]] | None) -> str | None:
    """The conversation's final answer: the last assistant turn's content when it calls no tool (None when
    it does: the trajectory ended before answering); the response itself for a single-turn rollout."""
    if messages is None or len(messages) == 0:
        return response.strip()
    last = messages[-1]
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    return str(last.get("content") or "").strip()


def score(prompts: list[str], responses: list[str], ground_truth: list[Any],
          messages: list[Any] | None = None, **columns: Any) -> list[float]:
    """1.0 when the final answer (:func:`final_answer`) equals the product, else 0.0."""
    check_reward_inputs(prompts, responses, ground_truth=ground_truth, **columns)
    chats = messages if messages is not None else [None] * len(responses)
    return [
        1.0 if truth is not None and final_answer(response, chat) == str(truth).strip() else 0.0
        for response, truth, chat in zip(responses, ground_truth, chats)
    ]
