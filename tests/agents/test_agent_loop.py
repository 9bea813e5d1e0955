"""The agent loops through the public API, with a scripted engine: token-in/token-out trajectories, the tool
turn's wrapper read off the chat template, bad calls as tool turns, budgets, concurrency, environments.

The tools here are also the ones the rollout and end-to-end tests name in their recipes
(``tests.agents.test_agent_loop:EchoTool``)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from rlhfctl.agents import AgentContext, AgentSample, Environment, Generation, Tool, ToolAgentLoop, ToolResult
from rlhfctl.agents.chat_turns import ChatTurns
from rlhfctl.agents.llm import RoundBatchedLLM
from rlhfctl.agents.loop import EnvironmentAgentLoop
from rlhfctl.agents.tool_calls import ParsedTurn, ToolCall, register_tool_call_parser
from tests.workers.recipes import tokenizer as char_tokenizer

EOS = 1


def _schema(name: str, **properties: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": properties, "required": list(properties)}}}


class EchoTool(Tool):
    """Returns ``echo:<text>`` after ``config['sleep_s']`` seconds, with reward 0.5 and a metric."""

    name = "echo"
    schema = _schema("echo", text={"type": "string"})

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.created: list[str] = []
        self.released: list[str] = []

    async def create(self, instance_id: str, **columns: Any) -> None:
        self.created.append(instance_id)

    async def execute(self, instance_id: str, arguments: Any) -> ToolResult:
        await asyncio.sleep(float(self.config.get("sleep_s", 0.0)))
        return ToolResult(text=f"echo:{arguments['text']}", reward=0.5, metrics={"chars": len(arguments["text"])})

    async def release(self, instance_id: str) -> None:
        self.released.append(instance_id)


class FailingTool(Tool):
    name = "fail"
    schema = _schema("fail")

    async def execute(self, instance_id: str, arguments: Any) -> ToolResult:
        raise RuntimeError("disk on fire")


class SlowTool(Tool):
    name = "slow"
    schema = _schema("slow")

    async def execute(self, instance_id: str, arguments: Any) -> ToolResult:
        await asyncio.sleep(30)
        return ToolResult(text="never")


@register_tool_call_parser("test_always_echo")
def always_echo(text: str) -> ParsedTurn:
    """Every turn calls ``echo`` (a random policy never writes a call itself): for the rollout tests."""
    return ParsedTurn(text, [ToolCall("echo", {"text": "hi"})])


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


class ScriptedLLM:
    """Answers each generate call with the next scripted turn (its characters, then EOS), and records the
    contexts it was given. Log-probs are distinct numbers, so their placement can be checked."""

    def __init__(self, turns: list[Any]) -> None:
        self.turns, self.contexts, self.generated = list(turns), [], []
        self.tokenizer = char_tokenizer()

    async def generate(self, token_ids: list[int], *, max_tokens: int, **sampling: Any) -> Generation:
        self.contexts.append(list(token_ids))
        turn = self.turns.pop(0) if self.turns else "done"
        ids = list(turn) if isinstance(turn, list) else self.tokenizer.encode(turn, add_special_tokens=False) + [EOS]
        ids = ids[:max_tokens]
        self.generated.append(ids)
        scores = [-(len(self.generated) + index / 100) for index in range(len(ids))]
        return Generation(ids, scores, finished=bool(ids) and ids[-1] == EOS)


def context(tools: dict[str, Tool] | None = None, **settings: Any) -> AgentContext:
    tok = char_tokenizer()
    base = {"max_turns": 4, "max_response_tokens": 200, "max_tool_response_tokens": 64, "tool_timeout_s": 5.0,
            "format": "hermes"}
    return AgentContext(tokenizer=tok, chat=ChatTurns(tok, [EOS]), eos_ids=[EOS], settings={**base, **settings},
                        max_new_tokens=1000, tools=tools or {}, environment=settings.pop("environment", None))


def sample(prompt: str = "user: add\nassistant: ", instance: str = "s-0") -> AgentSample:
    return AgentSample(char_tokenizer().encode(prompt, add_special_tokens=False), {"ground_truth": "3"}, instance)


def run(loop: Any, llm: Any, one: AgentSample | None = None) -> Any:
    return asyncio.run(loop.run(one or sample(), llm))


def test_the_engines_tokens_go_in_as_they_are_and_tool_turns_with_mask_0():
    echo = EchoTool()
    # The first turn holds <unk> (id 2): decoded and re-encoded it would become five characters.
    first = char_tokenizer().encode("ok " + call("echo", text="hi"), add_special_tokens=False) + [2, EOS]
    llm = ScriptedLLM([first, "bye"])
    trajectory = run(ToolAgentLoop(context({"echo": echo})), llm)
    tok = char_tokenizer()
    mask, ids = trajectory.response_mask, trajectory.response_ids
    assert [token for token, bit in zip(ids, mask) if bit] == llm.generated[0] + llm.generated[1]
    assert ids[: len(first)] == first and mask[: len(first)] == [1] * len(first)
    tool_part = [token for token, bit in zip(ids, mask) if not bit]
    # The char template's tail after an assistant message is "\n" (its EOS is no part of the template).
    assert tok.decode(tool_part) == "\ntool: echo:hi\nassistant: "
    assert llm.contexts[1] == trajectory.prompt_ids + ids[: len(first) + len(tool_part)]
    generated_scores = [score for score, bit in zip(trajectory.rollout_log_probs, mask) if bit]
    assert generated_scores == pytest.approx([-(1 + i / 100) for i in range(len(first))] + [-(2 + i / 100) for i in range(4)])
    assert all(score == 0.0 for score, bit in zip(trajectory.rollout_log_probs, mask) if not bit)
    assert trajectory.num_turns == 2 and trajectory.tool_calls == 1 and trajectory.tool_errors == 0
    assert not trajectory.truncated and trajectory.tool_rewards == 0.5
    assert trajectory.tool_metrics == {"echo/chars": [2.0]}
    roles = [message["role"] for message in trajectory.messages]
    assert roles == ["assistant", "tool", "assistant"]
    assert trajectory.messages[0]["tool_calls"][0]["function"] == {"name": "echo", "arguments": {"text": "hi"}}
    assert trajectory.messages[1] == {"role": "tool", "name": "echo", "content": "echo:hi"}
    assert echo.created == ["s-0"] and echo.released == ["s-0"]


def test_the_wrapper_drops_the_part_of_the_templates_tail_the_engine_already_generated():
    tok = char_tokenizer()
    tok.chat_template = (  # a ChatML-like template: the turn's end marker is the EOS token, then a newline
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<eos>\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    chat = ChatTurns(tok, [EOS])
    tool = [{"role": "tool", "content": "out"}]
    assert chat.text(tool, last_token=EOS) == "\ntool: out<eos>\nassistant: "
    assert chat.text(tool, last_token=None) == "<eos>\ntool: out<eos>\nassistant: "  # cut by max_new_tokens: no EOS


def test_bad_calls_and_failing_tools_become_tool_turns_and_count_as_errors():
    tools = {"echo": EchoTool(), "fail": FailingTool(), "slow": SlowTool()}
    turn = ("<tool_call>{not json}</tool_call>" + call("nope") + call("echo", text=3) + call("fail") + call("slow"))
    llm = ScriptedLLM([turn, "done"])
    start = time.perf_counter()
    trajectory = run(ToolAgentLoop(context(tools, tool_timeout_s=0.2, max_response_tokens=900,
                                            max_tool_response_tokens=200)), llm)
    assert time.perf_counter() - start < 5  # the slow tool was cut at its timeout
    outputs = [message["content"] for message in trajectory.messages if message["role"] == "tool"]
    assert len(outputs) == 5 and all(text.startswith("Error: ") for text in outputs)
    assert "not valid JSON" in outputs[0]
    assert "unknown tool 'nope'; the tools are: echo, fail, slow" in outputs[1]
    assert "invalid arguments for 'echo'" in outputs[2] and "is not of type 'string'" in outputs[2]
    assert "'fail' raised RuntimeError: disk on fire" in outputs[3]
    assert "'slow' timed out after 0.2 s" in outputs[4]
    assert trajectory.tool_calls == 5 and trajectory.tool_errors == 5
    assert trajectory.num_turns == 2 and not trajectory.truncated  # the model read the errors and went on


def test_max_turns_ends_a_trajectory_marked_truncated():
    llm = ScriptedLLM([call("echo", text="a")] * 10)
    trajectory = run(ToolAgentLoop(context({"echo": EchoTool()}, max_turns=3)), llm)
    assert trajectory.num_turns == 3 and trajectory.truncated
    assert trajectory.tool_calls == 2  # the last turn's call has no turn left to read its output: not run
    assert trajectory.response_mask[-1] == 1  # it ends on the policy's own token


def test_the_token_budget_cuts_the_response_exactly():
    llm = ScriptedLLM(["x" * 50])
    trajectory = run(ToolAgentLoop(context({"echo": EchoTool()}, max_response_tokens=17)), llm)
    assert len(trajectory.response_ids) == 17 and trajectory.response_mask == [1] * 17 and trajectory.truncated
    assert llm.contexts and len(llm.generated[0]) == 17  # the engine was asked for the budget, no more


def test_a_tool_turn_that_does_not_fit_ends_the_trajectory_on_the_policys_token():
    llm = ScriptedLLM([call("echo", text="hi"), "never"])
    trajectory = run(ToolAgentLoop(context({"echo": EchoTool()}, max_response_tokens=60)), llm)
    assert trajectory.truncated and trajectory.num_turns == 1 and trajectory.response_mask == [1] * len(llm.generated[0])
    assert len(trajectory.response_ids) <= 60


def test_long_tool_outputs_are_cut_to_max_tool_response_tokens():
    llm = ScriptedLLM([call("echo", text="y" * 40), "done"])
    trajectory = run(ToolAgentLoop(context({"echo": EchoTool()}, max_tool_response_tokens=10)), llm)
    assert trajectory.messages[1]["content"] == "echo:yyyyy"


def test_trajectories_run_together_rounds_batch_them_and_tool_waits_overlap():
    echo = EchoTool(sleep_s=0.1)
    sizes = []

    def batch_generate(requests):
        sizes.append(len(requests))
        text = call("echo", text="t") if len(sizes) < 3 else "end"
        ids = char_tokenizer().encode(text, add_special_tokens=False) + [EOS]
        return [Generation(ids, [0.0] * len(ids)) for _ in requests]

    loop = ToolAgentLoop(context({"echo": echo}, max_response_tokens=400))
    samples = [sample(instance=f"s-{index}") for index in range(16)]
    shared = RoundBatchedLLM(batch_generate, live=len(samples))

    async def all_of_them():
        async def one(order, item):
            handle = shared.bind(order)
            try:
                return await loop.run(item, handle)
            finally:
                handle.leave()
        return await asyncio.gather(*(one(order, item) for order, item in enumerate(samples)))

    start = time.perf_counter()
    trajectories = asyncio.run(all_of_them())
    seconds = time.perf_counter() - start
    assert sizes == [16, 16, 16] and shared.rounds == sizes  # one engine call per round, every trajectory in it
    assert all(t.num_turns == 3 and t.tool_calls == 2 for t in trajectories)
    assert seconds < 1.0, seconds  # 2 rounds of 16 x 100 ms tool calls would take 3.2 s one after another
    assert sorted(echo.released) == sorted(item.instance_id for item in samples)


def test_a_turns_calls_run_concurrently():
    llm = ScriptedLLM([call("echo", text="a") + call("echo", text="b") + call("echo", text="c"), "done"])
    trajectory = run(ToolAgentLoop(context({"echo": EchoTool(sleep_s=0.2)}, max_response_tokens=400)), llm)
    assert trajectory.tool_calls == 3 and trajectory.tool_latency_s >= 0.6  # summed over the calls...
    assert trajectory.spans and max(end for _, _, end in trajectory.spans) - min(start for _, start, _ in trajectory.spans) < 0.45


def test_tools_are_released_when_the_engine_fails():
    echo = EchoTool()

    class Broken:
        async def generate(self, token_ids, **kwargs):
            raise RuntimeError("engine down")

    with pytest.raises(RuntimeError, match="engine down"):
        run(ToolAgentLoop(context({"echo": echo})), Broken())
    assert echo.released == ["s-0"]


class CountdownEnvironment(Environment):
    """Three steps, reward 1 each; the episode starts with the text ``go:``."""

    async def reset(self, **columns: Any) -> str:
        self.left, self.truth = 3, columns.get("ground_truth")
        return "go:"

    async def step(self, action_text: str) -> tuple[str, float, bool]:
        self.left -= 1
        if action_text == "boom":
            raise ValueError("bad action")
        return f"left {self.left}", 1.0, self.left == 0


def test_an_environment_steps_each_turn_and_its_rewards_are_summed():
    llm = ScriptedLLM(["a", "boom", "c"])
    loop = EnvironmentAgentLoop(context(environment=(CountdownEnvironment, {}), max_turns=5))
    trajectory = run(loop, llm)
    tok = char_tokenizer()
    assert tok.decode(trajectory.response_ids[:3]) == "go:" and trajectory.response_mask[:3] == [0, 0, 0]
    assert [t for t, bit in zip(trajectory.response_ids, trajectory.response_mask) if bit] == sum(llm.generated, [])
    assert trajectory.num_turns == 3 and not trajectory.truncated
    assert trajectory.tool_rewards == 2.0 and trajectory.tool_calls == 3 and trajectory.tool_errors == 1
    users = [message["content"] for message in trajectory.messages if message["role"] == "user"]
    assert users[0] == "go:" and users[1] == "left 2" and "bad action" in users[2]
    assert "\nuser: left 2\nassistant: " in tok.decode(trajectory.response_ids)


def test_per_call_sampling_settings_are_refused_by_name():
    shared = RoundBatchedLLM(lambda requests: [], live=1)
    with pytest.raises(ValueError, match="per-call sampling settings \\(temperature\\) are not supported"):
        asyncio.run(shared.bind(0).generate([1, 2], max_tokens=4, temperature=0.5))
