"""The bundled arithmetic task: its prompts, its tool-use demonstrations (the tokens SFT learns are the tokens
the agent loop parses and appends) and its 0/1 reward."""

from __future__ import annotations

import asyncio

import pytest

from rlhfctl.agents.chat_turns import ChatTurns
from rlhfctl.agents.tool_calls import hermes_parser
from rlhfctl.agents.tools import Calculator
from rlhfctl.data.chat_masks import ChatLayout
from rlhfctl.models.tokenizer import CharTokenizer
from rlhfctl.tasks import get_task
from rlhfctl.tasks.arithmetic import (
    final_answer,
    make_demonstrations,
    make_direct_demonstrations,
    make_prompts,
    score,
    tool_call,
)

CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"30*44"}}</tool_call>'


def test_prompts_are_two_digit_products_and_deterministic() -> None:
    assert make_prompts(2, seed=0) == [{"prompt": "30*44=", "ground_truth": "1320"},
                                       {"prompt": "97*61=", "ground_truth": "5917"}]
    records = make_prompts(200, seed=3)
    assert records == make_prompts(200, seed=3) and records != make_prompts(200, seed=4)
    for record in records:
        a, b = record["prompt"].removesuffix("=").split("*")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert record["ground_truth"] == str(int(a) * int(b))
    assert make_prompts(0, seed=0) == []
    with pytest.raises(ValueError, match="non-negative"):
        make_prompts(-1, seed=0)


def test_the_demonstration_calls_the_calculator_and_repeats_its_answer() -> None:
    record = make_demonstrations(1, seed=0)[0]
    assert record["messages"] == [
        {"role": "user", "content": "30*44="},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "name": "calculator", "content": "1320"},
        {"role": "assistant", "content": "1320"},
    ]
    assert record["tools"] == [dict(Calculator.schema)] and record["ground_truth"] == "1320"
    assert tool_call("30*44") == CALL
    truths = [prompt["ground_truth"] for prompt in make_prompts(5, seed=1)]
    assert [demo["ground_truth"] for demo in make_demonstrations(5, seed=1)] == truths


def test_the_call_is_what_the_hermes_parser_reads_and_the_tool_turn_what_the_calculator_returns() -> None:
    for record in make_demonstrations(20, seed=2):
        call_turn, tool_turn = record["messages"][1], record["messages"][2]
        parsed = hermes_parser(call_turn["content"])
        assert parsed.content == "" and len(parsed.calls) == 1
        call = parsed.calls[0]
        assert call.error is None and call.name == "calculator"
        assert call.arguments == {"expression": record["messages"][0]["content"].removesuffix("=")}
        result = asyncio.run(Calculator().execute("t", call.arguments))
        assert result.text == tool_turn["content"] == record["ground_truth"]


def test_sft_learns_the_tokens_an_agent_rollout_generates_and_sees_the_context_it_appends() -> None:
    tokenizer = CharTokenizer()
    eos = tokenizer.eos_token_id
    messages = make_demonstrations(1, seed=0)[0]["messages"]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == (
        f"user: 30*44=\nassistant: {CALL}\ntool: 1320\nassistant: 1320\n")

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    chat = ChatLayout(tokenizer, encode, eos).tokens(messages, [dict(Calculator.schema)])
    # The prompt is what the rollout's prompt renders to: the user turn with the generation header.
    assert chat.prompt_ids == encode(tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True))
    assert chat.prompt_ids == encode("user: 30*44=\nassistant: ")
    # Learned: the call and its eos, then the answer and its eos; between them exactly what the agent loop appends.
    between = ChatTurns(tokenizer, [eos]).token_ids([messages[2]], last_token=eos)
    assert tokenizer.decode(between) == "\ntool: 1320\nassistant: "
    expected = encode(CALL) + [eos] + between + encode("1320") + [eos]
    assert chat.response_ids == expected
    assert chat.response_mask == [1] * (len(CALL) + 1) + [0] * len(between) + [1] * 5


def test_direct_demonstrations_answer_without_the_tool() -> None:
    assert make_direct_demonstrations(1, seed=0) == [{"messages": [
        {"role": "user", "content": "30*44="}, {"role": "assistant", "content": "1320"}], "ground_truth": "1320"}]


def test_score_is_one_for_the_product_as_the_final_answer() -> None:
    prompts = ["30*44="] * 6
    truth = ["1320"] * 6
    user = {"role": "user", "content": "30*44="}
    calls = [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "30*44"}}}]
    called = {"role": "assistant", "content": "", "tool_calls": calls}
    tool = {"role": "tool", "name": "calculator", "content": "1320"}
    chats = [
        [user, called, tool, {"role": "assistant", "content": "1320"}],
        [user, called, tool, {"role": "assistant", "content": " 1320 "}],
        [user, called, tool, {"role": "assistant", "content": "1321"}],
        [user, called, tool, called],                      # ran out of turns before answering
        [user, {"role": "assistant", "content": "1320"}],  # answered alone, right
        [user, {"role": "assistant", "content": "13200"}],
    ]
    assert score(prompts, ["r"] * 6, ground_truth=truth, messages=chats) == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]


def test_score_without_messages_reads_the_single_turn_response() -> None:
    responses = ["1320", " 1320\n", "1320 is it", "", "5917"]
    truth = ["1320", "1320", "1320", "1320", None]
    assert score(["p"] * 5, responses, ground_truth=truth) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert final_answer("x", []) == "x"
    with pytest.raises(ValueError, match="column"):
        score(["p"] * 2, ["1", "2"], ground_truth=["1"])


def test_the_tasks_are_registered() -> None:
    task = get_task("arithmetic")
    assert task.make_prompts is make_prompts and task.score is score
    assert task.make_demonstrations is make_demonstrations and task.make_preferences is None
    direct = get_task("arithmetic-direct")
    assert direct.make_demonstrations is make_direct_demonstrations and direct.score is score
