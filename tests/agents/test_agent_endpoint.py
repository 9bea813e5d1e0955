"""The OpenAI-compatible endpoint (``rollout.agent_server``) with a real tiny hf engine and real HTTP on 127.0.0.1:
answers in OpenAI's shape, trajectories made of exactly the tokens it handed out, masks 1 on sampled tokens and 0 on
the turns a program added, tool calls in OpenAI form, auth, failures and hangs as failed trajectories within their
timeouts, bounded concurrency and queue. The programs are in ``tests/agents/endpoint_programs.py``."""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from rlhfctl.agents.chat_turns import ChatTurns
from rlhfctl.agents.endpoint import program as program_module
from rlhfctl.agents.endpoint.client import EndpointClient
from rlhfctl.agents.endpoint.loop import EndpointAgentLoop
from rlhfctl.agents.endpoint.program import abandoned_threads, load_program
from rlhfctl.agents.endpoint.program_reward import program_reward
from rlhfctl.agents.endpoint.server import AgentEndpoint
from rlhfctl.agents.endpoint.session import Session
from rlhfctl.agents.endpoint.settings import endpoint_settings
from rlhfctl.agents.llm import Generation, GenerationRequest
from rlhfctl.agents.loop import AgentContext, AgentSample
from rlhfctl.models.loading import load_causal_lm
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.rollout.agent_rollout import AgentRollout, hf_batch_generate
from rlhfctl.rollout.generation import SamplingParams, eos_token_ids
from tests.agents import endpoint_programs as programs
from tests.workers.conftest import local_group
from tests.workers.recipes import TINY_MODEL, digits_prompts, tiny_recipe
from tests.workers.recipes import tokenizer as char_tokenizer
from workers import ActorWorker
from workers.rollout_worker import RolloutWorker

MULTI_TURN = {"enable": True, "max_turns": 4, "max_response_tokens": 64, "max_tool_response_tokens": 16,
              "tool_timeout_s": 10.0, "format": "hermes"}
SETTINGS = endpoint_settings({"program": "tests.agents.endpoint_programs:two_turns", "batch_wait_s": 0.5}, MULTI_TURN, 8)


@pytest.fixture(scope="module")
def tok() -> Any:
    return char_tokenizer()


@pytest.fixture(scope="module")
def model(tok) -> Any:
    return load_causal_lm(TINY_MODEL, tok, seed=0).eval()


@pytest.fixture(autouse=True)
def fresh_records():
    programs.SEEN.clear()
    programs.ACTIVE.update(now=0, most=0)
    yield


def hf_engine(model: Any, tok: Any, seed: int = 0) -> Any:
    """The rollout's own hf BatchGenerate on the tiny model."""
    return hf_batch_generate(model, SamplingParams(n=1, max_new_tokens=8), eos_ids=eos_token_ids(tok, model),
                             pad_id=int(tok.pad_token_id), device=torch.device("cpu"), generator=torch.Generator().manual_seed(seed))


def samples(tok: Any, count: int, **columns: Any) -> list[AgentSample]:
    return [AgentSample(list(tok.encode(f"digits {i}:", add_special_tokens=False)),
                        {"prompt_text": f"digits {i} {i + 1}:", "index": np.int64(i), **columns}, f"p{i}")
            for i in range(count)]


def roll(tok: Any, engine: Any, program: Any, count: int = 3, width: int = 16, eos: list[int] | None = None,
         **changes: Any) -> tuple[list[Any], EndpointAgentLoop, float]:
    """One rollout call of the endpoint loop: the trajectories, the loop (its last runs and rounds), seconds."""
    eos = eos or [int(tok.eos_token_id)]
    columns = changes.pop("columns", {})
    context = AgentContext(tokenizer=tok, chat=ChatTurns(tok, eos), eos_ids=eos, settings=MULTI_TURN, max_new_tokens=8)
    loop = EndpointAgentLoop(context, replace(SETTINGS, **changes), program)
    start = time.perf_counter()
    trajectories = asyncio.run(loop.run_batch(samples(tok, count, **columns), engine, width))
    return trajectories, loop, time.perf_counter() - start


def mask_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(value, length) of each run of equal values."""
    runs: list[tuple[int, int]] = []
    for value in mask:
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1] + 1)
        else:
            runs.append((value, 1))
    return runs


# ---------------------------------------------------------------------------------------------- shapes
def test_chat_completions_and_models_answer_in_openais_shape(tok, model):
    trajectories, loop, _ = roll(tok, hf_engine(model, tok), programs.shapes, count=1, max_turns=8)
    entry = programs.SEEN[0]
    models, chat, stream, text, ids, text_stream = entry["responses"]
    assert entry["statuses"] == [200, 200]
    assert models["object"] == "list" and models["data"][0]["id"] == "policy"

    assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-") and chat["model"] == "policy"
    choice = chat["choices"][0]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length") and "tool_calls" not in choice["message"]
    assert chat["usage"] == {"prompt_tokens": len(chat["prompt_token_ids"]), "completion_tokens": len(choice["token_ids"]),
                             "total_tokens": len(chat["prompt_token_ids"]) + len(choice["token_ids"])}
    assert [entry["token"] for entry in choice["logprobs"]["content"]] == [tok.decode([t]) for t in choice["token_ids"]]
    assert all(entry["logprob"] <= 0 for entry in choice["logprobs"]["content"])
    assert tok.decode(chat["prompt_token_ids"]) == "user: hi\nassistant: "

    events = [line[len("data: "):] for line in stream.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert [chunk["object"] for chunk in chunks] == ["chat.completion.chunk"] * 3
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant" and chunks[1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[2]["choices"] == [] and chunks[2]["usage"]["prompt_tokens"] == len(chat["prompt_token_ids"])

    assert text["object"] == "text_completion" and text["id"].startswith("cmpl-")
    assert tok.decode(text["prompt_token_ids"]) == "digits 3:" and 1 <= len(text["choices"][0]["token_ids"]) <= 4
    assert text["choices"][0]["logprobs"]["tokens"] == [tok.decode([t]) for t in text["choices"][0]["token_ids"]]
    assert ids["prompt_token_ids"] == [71, 76, 74] and len(ids["choices"][0]["token_ids"]) <= 3
    assert text_stream.endswith("data: [DONE]\n\n") and '"text_completion"' in text_stream
    # The chain is the first chat: the later requests start over (divergent), served but not trained on.
    runs = loop.last_runs[0]
    assert [record.in_trajectory for record in runs.records] == [True, False, False, False, False]
    assert trajectories[0].tool_metrics["endpoint/divergent_requests"] == [4.0]


# ---------------------------------------------------------------------------------------------- tokens and masks
def test_the_trajectory_is_the_recorded_tokens_with_added_turns_masked(tok, model):
    trajectories, loop, _ = roll(tok, hf_engine(model, tok), programs.two_turns, count=3)
    for trajectory, run in zip(trajectories, loop.last_runs):
        first, second = run.records
        assert first.in_trajectory and second.in_trajectory and run.outcome.error is None
        assert trajectory.prompt_ids == first.prompt_ids
        assert trajectory.context_ids == second.prompt_ids + second.token_ids  # one chain, nothing re-tokenized
        added = second.prompt_ids[len(first.prompt_ids) + len(first.token_ids):]
        assert tok.decode(added) == "\nuser: again\nassistant: "
        assert trajectory.response_ids == first.token_ids + added + second.token_ids
        assert trajectory.response_mask == [1] * len(first.token_ids) + [0] * len(added) + [1] * len(second.token_ids)
        assert trajectory.rollout_log_probs == first.log_probs + [0.0] * len(added) + second.log_probs
        assert trajectory.num_turns == 2 and trajectory.reward_extra == {"tool_rewards": 0.0, "program_reward": None, "endpoint_error": None}
    # what the client was told is what was recorded
    told = {entry["sample"]["index"]: entry["responses"] for entry in programs.SEEN}
    for index, run in enumerate(loop.last_runs):
        for record, response in zip(run.records, told[index]):
            assert response["prompt_token_ids"] == record.prompt_ids and response["choices"][0]["token_ids"] == record.token_ids
            assert [e["logprob"] for e in response["choices"][0]["logprobs"]["content"]] == pytest.approx(record.log_probs)
    assert loop.rounds == [3, 3]  # each turn of the three programs in one engine round


def test_the_recorded_log_probs_are_the_models_own(tok, model):
    trajectories, _, _ = roll(tok, hf_engine(model, tok), programs.two_turns, count=2)
    for trajectory in trajectories:
        ids = torch.tensor([trajectory.context_ids])
        with torch.no_grad():
            logits = model(ids).logits.float()
        scores = torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
        start = len(trajectory.prompt_ids)
        mask = torch.tensor(trajectory.response_mask, dtype=torch.bool)
        mine = scores[start - 1:][mask]
        assert torch.allclose(mine, torch.tensor(trajectory.rollout_log_probs)[mask], atol=1e-4)


def test_the_rollout_batch_holds_the_programs_tokens_with_its_prompt_overflowing_into_the_response(tok, model):
    rollout = {"n": 2, "max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "do_sample": True,
               "multi_turn": MULTI_TURN, "agent_server": {"program": "tests.agents.endpoint_programs:two_turns"}}
    eos = eos_token_ids(tok, model)
    agent = AgentRollout(rollout, tok, eos, int(tok.pad_token_id))
    prompts = digits_prompts(2)
    batch = agent.generate(prompts, SamplingParams(n=2, max_new_tokens=8), hf_engine(model, tok))
    width = prompts.batch["input_ids"].shape[1]
    assert batch.batch["prompts"].shape == (4, width) and batch.batch["responses"].shape == (4, 64)
    told = [entry["responses"] for entry in programs.SEEN]
    for row in range(4):
        attention = batch.batch["attention_mask"][row].bool()
        sequence = batch.batch["input_ids"][row][attention].tolist()
        matches = [replies for replies in told if replies[1]["prompt_token_ids"] + replies[1]["choices"][0]["token_ids"] == sequence]
        assert len(matches) == 1, row  # every row is exactly one program's tokens, as the endpoint handed them out
        first, second = matches[0]
        prompt = first["prompt_token_ids"]
        assert len(prompt) > width  # the chat-rendered prompt is wider than the dataset's: its tail starts the response
        real = int(batch.batch["attention_mask"][row, width:].sum())
        mask = batch.batch["response_mask"][row, :real].tolist()
        sampled = [len(first["choices"][0]["token_ids"]), len(second["choices"][0]["token_ids"])]
        added = len(second["prompt_token_ids"]) - len(prompt) - sampled[0]
        assert mask_runs(mask) == [(0, len(prompt) - width), (1, sampled[0]), (0, added), (1, sampled[1])]
        logged = batch.batch["rollout_log_probs"][row, :real][torch.tensor(mask, dtype=torch.bool)].tolist()
        assert logged == pytest.approx([e["logprob"] for reply in (first, second) for e in reply["choices"][0]["logprobs"]["content"]], abs=1e-6)
        messages = batch.non_tensor_batch["messages"][row]
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"] and messages[2]["content"] == "again"
        assert batch.non_tensor_batch["num_turns"][row] == 2 and batch.non_tensor_batch["agent/tool_metrics"][row]["endpoint/requests"] == 2.0
    assert list(batch.non_tensor_batch["uid"]) == ["p0", "p0", "p1", "p1"]


def test_a_float_from_the_program_is_its_trajectorys_tool_rewards_and_program_reward(tok, model):
    trajectories, _, _ = roll(tok, hf_engine(model, tok), programs.rewarded, count=2)
    told = {entry["sample"]["index"]: entry["responses"][0] for entry in programs.SEEN}
    for index, trajectory in enumerate(trajectories):
        expected = len(told[index]["choices"][0]["message"]["content"]) / 10
        assert trajectory.reward_extra["program_reward"] == pytest.approx(expected) == trajectory.tool_rewards
    scores = program_reward(["p"] * 2, ["r"] * 2, [t.reward_extra for t in trajectories])
    assert scores == pytest.approx([t.tool_rewards for t in trajectories])
    assert program_reward(["p"], ["r"], [{"program_reward": None, "endpoint_error": "ValueError: x"}]) == [0.0]
    with pytest.raises(ValueError, match="returned None"):
        program_reward(["p"], ["r"], [{"program_reward": None, "endpoint_error": None}])


# ---------------------------------------------------------------------------------------------- tool calls
TOOL_TEMPLATE = (  # the character template, plus the tools and each assistant message's calls
    "{% if tools %}{{ 'tools: ' + (tools | map(attribute='function') | map(attribute='name') | join(',')) + '\\n' }}{% endif %}"
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}{{ '<tool_call>' + (c['function'] | tojson) + '</tool_call>' }}{% endfor %}"
    "{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def test_tool_calls_come_back_in_openai_format_and_the_tool_turn_is_masked(tok):
    tool_tok = copy.deepcopy(tok)
    tool_tok.chat_template = TOOL_TEMPLATE
    eos = int(tok.eos_token_id)
    call = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'

    def scripted(requests: list[Any]) -> list[Generation]:  # the model's turns, written out (a random model calls nothing)
        texts = ["done" if "tool: echo:hi" in tool_tok.decode(request.token_ids) else call for request in requests]
        ids = [list(tool_tok.encode(text, add_special_tokens=False)) + [eos] for text in texts]
        return [Generation(tokens[:request.max_tokens], [-0.5] * len(tokens[:request.max_tokens]), finished=True)
                for tokens, request in zip(ids, requests)]

    trajectories, loop, _ = roll(tool_tok, scripted, programs.uses_echo, count=1, max_response_tokens=200, max_new_tokens=100)
    first, second = programs.SEEN[0]["responses"]
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (tool_call,) = choice["message"]["tool_calls"]
    assert tool_call["type"] == "function" and tool_call["id"].startswith("call_")
    assert tool_call["function"] == {"name": "echo", "arguments": '{"text": "hi"}'}
    assert tool_tok.decode(first["prompt_token_ids"]) == "tools: echo\nuser: use echo\nassistant: "  # tools rendered
    assert second["choices"][0]["message"] == {"role": "assistant", "content": "done"} and second["choices"][0]["finish_reason"] == "stop"
    run, trajectory = loop.last_runs[0], trajectories[0]
    assert [record.in_trajectory for record in run.records] == [True, True]
    added = second["prompt_token_ids"][len(first["prompt_token_ids"]) + len(choice["token_ids"]):]
    assert tool_tok.decode(added) == "\ntool: echo:hi\nassistant: "  # the model's call kept as sampled, the tool turn spliced after it
    assert mask_runs(trajectory.response_mask) == [(1, len(choice["token_ids"])), (0, len(added)), (1, 5)]
    assert trajectory.tool_calls == 1 and trajectory.messages[1]["tool_calls"][0]["function"]["arguments"] == {"text": "hi"}


# ---------------------------------------------------------------------------------------------- the door
def test_requests_need_the_token_and_a_live_session(tok, model):
    eos = [int(tok.eos_token_id)]

    async def scenario() -> dict[str, Any]:
        engine = hf_engine(model, tok)

        class Direct:  # any LLM: here the engine called per request
            async def generate(self, token_ids, *, max_tokens):
                return engine([GenerationRequest(0, list(token_ids), max_tokens)])[0]

        async with AgentEndpoint(tok, eos, SETTINGS) as endpoint:
            session = endpoint.open_session(Direct(), fallback_prompt_ids=[5])
            url = endpoint.base_url(session.session_id)
            body = {"messages": [{"role": "user", "content": "hi"}]}
            seen = {
                "none": await EndpointClient(url, "").request("POST", "/chat/completions", body),
                "wrong": await EndpointClient(url, "x" + endpoint.token).request("POST", "/chat/completions", body),
                "good": await EndpointClient(url, endpoint.token).request("POST", "/chat/completions", body),
                "route": await EndpointClient(url, endpoint.token).request("POST", "/embeddings", body),
                "json": await EndpointClient(url, endpoint.token).request("POST", "/chat/completions", [1]),
                "n": await EndpointClient(url, endpoint.token).request("POST", "/chat/completions", {**body, "n": 2}),
            }
            endpoint.close_session(session)
            seen["ended"] = await EndpointClient(url, endpoint.token).request("POST", "/chat/completions", body)
            seen["host"] = url.split("/")[2].split(":")[0]
            seen["records"] = len(session.records)
        return seen

    seen = asyncio.run(scenario())
    assert seen["none"][0] == 401 and seen["wrong"][0] == 401 and seen["none"][1]["error"]["code"] == "invalid_api_key"
    assert seen["good"][0] == 200 and seen["records"] == 1
    assert seen["route"][0] == 404 and "/v1/chat/completions" in seen["route"][1]["error"]["message"]
    assert seen["json"][0] == 400 and "JSON object" in seen["json"][1]["error"]["message"]
    assert seen["n"][0] == 400 and seen["n"][1]["error"]["param"] == "n"
    assert seen["ended"][0] == 404 and "has ended" in seen["ended"][1]["error"]["message"]
    assert seen["host"] == "127.0.0.1"


def test_the_endpoint_listens_on_a_free_port_of_its_range_and_names_the_key_when_none_is(tok):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]

        async def serve(first: int, last: int) -> int:
            async with AgentEndpoint(tok, [1], replace(SETTINGS, port_range=(first, last))) as endpoint:
                return endpoint.port

        last = min(busy + 20, 65535)
        assert busy < asyncio.run(serve(busy, last)) <= last or busy == last  # the busy one skipped
        with pytest.raises(RecipeError, match=rf"^rollout.agent_server.port_range: no free port in {busy}..{busy} on 127.0.0.1"):
            asyncio.run(serve(busy, busy))


# ---------------------------------------------------------------------------------------------- failures
def test_a_program_that_raises_is_a_failed_trajectory_and_the_others_train(tok, model):
    def mixed(**kwargs):
        return (programs.raises if kwargs["sample"]["index"] == 1 else programs.rewarded)(**kwargs)

    async def program(*, base_url, api_key, model, sample):
        return await mixed(base_url=base_url, api_key=api_key, model=model, sample=sample)

    trajectories, loop, _ = roll(tok, hf_engine(model, tok), program, count=3)
    failed = trajectories[1]
    assert failed.response_ids == [] and failed.prompt_ids == samples(tok, 3)[1].prompt_ids  # nothing to train on
    assert failed.reward_extra["program_reward"] is None and failed.tool_rewards == 0.0
    assert failed.reward_extra["endpoint_error"].startswith("ValueError: no answer found (endpoint_programs.py:")
    assert failed.tool_metrics["endpoint/errors"] == [1.0] and failed.tool_metrics["endpoint/timeouts"] == [0.0]
    for good in (trajectories[0], trajectories[2]):
        assert good.reward_extra["endpoint_error"] is None and sum(good.response_mask) > 0
        assert good.tool_metrics["endpoint/errors"] == [0.0]


def test_hanging_and_blocking_programs_fail_within_the_timeout(tok, model, monkeypatch):
    monkeypatch.setattr(program_module, "_STOP_GRACE_S", 0.1)

    async def program(*, base_url, api_key, model, sample):
        choice = {0: programs.hangs, 1: programs.blocks, 2: programs.rewarded}[sample["index"]]
        return await choice(base_url=base_url, api_key=api_key, model=model, sample=sample)

    # the good program needs one chat call inside the timeout; a loaded CI machine once took over 1 s for it, so
    # the timeout is 4 s and the blocked program sleeps 12 s: wide margins on both sides of the order
    trajectories, loop, seconds = roll(tok, hf_engine(model, tok), program, count=3, trajectory_timeout_s=4.0,
                                       columns={"block_s": 12.0})
    assert seconds < 10.0  # the step did not wait for either
    for hung in trajectories[:2]:
        assert hung.response_ids == [] and hung.tool_metrics["endpoint/timeouts"] == [1.0]
        assert "did not finish within 4 s (rollout.agent_server.trajectory_timeout_s)" in hung.reward_extra["endpoint_error"]
    assert trajectories[2].reward_extra["endpoint_error"] is None and sum(trajectories[2].response_mask) > 0
    assert abandoned_threads() == 1  # the blocked one still sleeps in its daemon thread
    deadline = time.monotonic() + 30.0
    while abandoned_threads() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert abandoned_threads() == 0


def test_a_request_waiting_past_its_timeout_gets_504(tok, model):
    async def program(*, base_url, api_key, model, sample):
        return await programs.waits_then_asks(base_url=base_url, api_key=api_key, model=model, sample=sample)

    changes = {"request_timeout_s": 0.5, "batch_wait_s": 20.0}
    context = AgentContext(tokenizer=tok, chat=ChatTurns(tok, [1]), eos_ids=[1], settings=MULTI_TURN, max_new_tokens=8)
    loop = EndpointAgentLoop(context, replace(SETTINGS, **changes), program)
    late = [AgentSample([5], {"index": 0, "delay_s": 0.0}, "a"), AgentSample([5], {"index": 1, "delay_s": 4.0}, "b")]
    trajectories = asyncio.run(loop.run_batch(late, hf_engine(model, tok), 8))
    statuses = {entry["sample"]["index"]: entry["statuses"][0] for entry in programs.SEEN}
    assert statuses == {0: 504, 1: 200}  # the first waited for the second past its request timeout
    assert trajectories[0].tool_metrics["endpoint/request_timeouts"] == [1.0]
    assert programs.SEEN[0]["responses"][0]["error"]["code"] == "request_timeout"


def test_an_engine_failure_fails_the_rollout_not_the_programs(tok):
    def broken(requests):
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        roll(tok, broken, programs.rewarded, count=2)


# ---------------------------------------------------------------------------------------------- bounds
def test_concurrency_per_rank_is_bounded_and_rounds_follow_it(tok, model):
    trajectories, loop, _ = roll(tok, hf_engine(model, tok), programs.counted, count=6, max_concurrency=2, batch_wait_s=0.1)
    assert programs.ACTIVE["most"] == 2 and max(loop.rounds) <= 2 and sum(loop.rounds) == 12
    assert all(t.reward_extra["program_reward"] == 0.5 for t in trajectories)


def test_a_full_queue_answers_429_and_the_program_retries(tok, model):
    trajectories, loop, _ = roll(tok, hf_engine(model, tok), programs.retries_on_429, count=2, queue_size=1, batch_wait_s=0.3)
    statuses = [entry["statuses"] for entry in programs.SEEN]
    assert all(seen[-1] == 200 for seen in statuses) and any(429 in seen for seen in statuses)
    rejected = sum(seen.count(429) for seen in statuses)
    assert sum(t.tool_metrics["endpoint/rejected_requests"][0] for t in trajectories) == rejected


def test_a_divergent_request_is_served_but_not_trained_on(tok, model):
    trajectories, loop, _ = roll(tok, hf_engine(model, tok), programs.branches, count=1)
    run, trajectory = loop.last_runs[0], trajectories[0]
    first, other, third = run.records
    assert [first.in_trajectory, other.in_trajectory, third.in_trajectory] == [True, False, True]
    assert other.token_ids and trajectory.context_ids == third.prompt_ids + third.token_ids
    assert trajectory.tool_metrics["endpoint/divergent_requests"] == [1.0] and trajectory.num_turns == 2


def test_a_session_keeps_the_first_chain_when_its_requests_overlap():
    session = Session("s", fallback_prompt_ids=[9], max_response_tokens=20, max_turns=4)
    a, b = session.admit([5, 6]), session.admit([5, 7])  # two first requests at once
    assert a.kind == b.kind == "first"
    assert session.record("chat", a, [5, 6], [10, 11], [-1.0, -2.0], finished=True, finish_reason="stop")
    assert not session.record("chat", b, [5, 7], [12], [-1.0], finished=True, finish_reason="stop")
    c, d = session.admit([5, 6, 10, 11, 3]), session.admit([5, 6, 10, 11, 4])  # two continuations at once
    assert c.kind == d.kind == "extends" and c.new_context == [3] and c.max_tokens == 20 - 3
    assert session.record("chat", c, [5, 6, 10, 11, 3], [13], [-3.0], finished=False, finish_reason="length")
    assert not session.record("chat", d, [5, 6, 10, 11, 4], [14], [-4.0], finished=True, finish_reason="stop")
    trajectory = session.finish(reward=0.25, error=None, timed_out=False, seconds=1.0)
    assert trajectory.prompt_ids == [5, 6] and trajectory.response_ids == [10, 11, 3, 13]
    assert trajectory.response_mask == [1, 1, 0, 1] and trajectory.rollout_log_probs == [-1.0, -2.0, 0.0, -3.0]
    assert trajectory.truncated  # its last turn ran out of tokens
    assert trajectory.tool_metrics["endpoint/divergent_requests"] == [2.0] and trajectory.tool_rewards == 0.25


def test_requests_past_max_turns_sample_nothing_and_truncate(tok, model):
    trajectories, loop, _ = roll(tok, hf_engine(model, tok), programs.keeps_asking, count=1, max_turns=2, columns={"asks": 3})
    replies = programs.SEEN[0]["responses"]
    assert replies[2]["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "length", "logprobs": None}
    assert replies[2]["usage"]["completion_tokens"] == 0
    assert trajectories[0].num_turns == 2 and trajectories[0].truncated


# ---------------------------------------------------------------------------------------------- loading
def test_load_program_names_the_key_for_each_problem(tmp_path, monkeypatch):
    (tmp_path / "progs.py").write_text("def sync(**k):\n    return 1\n\nasync def narrow(base_url):\n    return 1\n\nasync def ok(**k):\n    return 1\n")
    monkeypatch.chdir(tmp_path)
    assert load_program("progs.py:ok").__name__ == "ok"
    for ref, words in [("nope_module:run", "cannot import 'nope_module:run': ModuleNotFoundError"),
                       ("progs.py:missing", "has no attribute 'missing'"),
                       ("progs.py:sync", "is not an async function"),
                       ("progs.py:narrow", "does not take api_key, model, sample by keyword"),
                       ("progs.py", "must be 'package.module:function'")]:
        with pytest.raises(RecipeError, match="^rollout.agent_server.program: ") as caught:
            load_program(ref)
        assert words in str(caught.value) and caught.value.key_path == "rollout.agent_server.program"


def test_the_openai_client_works_against_the_endpoint_when_installed(tok, model):
    pytest.importorskip("openai")

    async def program(*, base_url, api_key, model, sample):
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        reply = await client.chat.completions.create(model=model, messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        stream = await client.chat.completions.create(model=model, messages=messages, stream=True)
        streamed = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        await client.close()
        programs.keep(sample, [reply.model_dump(), streamed])
        return 1.0

    trajectories, loop, _ = roll(tok, hf_engine(model, tok), program, count=1)
    reply, streamed = programs.SEEN[0]["responses"]
    assert reply["choices"][0]["message"]["role"] == "assistant" and reply["usage"]["prompt_tokens"] == 20
    assert [record.in_trajectory for record in loop.last_runs[0].records] == [True, True]  # the SDK's message dump splices
    second = loop.last_runs[0].records[1]
    assert streamed == tok.decode([t for t in second.token_ids if t != tok.eos_token_id], skip_special_tokens=True)
    assert trajectories[0].num_turns == 2


# ---------------------------------------------------------------------------------------------- both placements
def endpoint_recipe(engine: str = "hf", **rollout: Any) -> dict[str, Any]:
    """A tiny actor recipe whose rollout is the two-turn program (vLLM's CPU attention needs hidden 64 over 2 heads)."""
    model = {"config": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                        "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 128}}
    return tiny_recipe(rollout={"engine": engine, "n": 2, "max_new_tokens": 8, "multi_turn": MULTI_TURN,
                                "agent_server": {"program": "tests.agents.endpoint_programs:two_turns"},
                                "vllm": {"cpu_kv_cache_gib": 0.0625}, **rollout},
                       roles={"actor": {"model": model}})


def served_rows(batch: Any) -> list[list[dict[str, Any]]]:
    """For each row of a rollout batch, the one program run whose served chain its real tokens are (asserted)."""
    told = [entry["responses"] for entry in programs.SEEN]
    rows = []
    for row in range(len(batch)):
        sequence = batch.batch["input_ids"][row][batch.batch["attention_mask"][row].bool()].tolist()
        matches = [r for r in told if r[-1]["prompt_token_ids"] + r[-1]["choices"][0]["token_ids"] == sequence]
        assert len(matches) == 1, row
        rows.append(matches[0])
    return rows


@pytest.mark.parametrize("placement", ["colocated", "separate"])
def test_both_rollout_placements_serve_the_program_and_score_its_tokens_as_the_engine_did(placement):
    recipe = endpoint_recipe(**({"placement": "separate", "pool": "global"} if placement == "separate" else {}))
    worker, role = (RolloutWorker, "rollout") if placement == "separate" else (ActorWorker, "actor")
    with local_group(worker, recipe, role) as group:
        rollout = group.generate_sequences(digits_prompts(4))
        assert group.workers[0].agent_rollout.last_rounds == [8, 8]
    served = served_rows(rollout)
    mask = rollout.batch["response_mask"].bool()
    for row, (first, second) in enumerate(served):
        sampled = first["choices"][0]["token_ids"] + second["choices"][0]["token_ids"]
        assert rollout.batch["responses"][row][mask[row]].tolist() == sampled
    with local_group(ActorWorker, endpoint_recipe(), "actor") as actor:
        scored = actor.compute_log_prob(rollout)
    diff = (scored.batch["old_log_probs"] - rollout.batch["rollout_log_probs"]).abs()[mask]
    assert diff.numel() == sum(len(f["choices"][0]["token_ids"]) + len(s["choices"][0]["token_ids"]) for f, s in served)
    assert float(diff.max()) <= 1e-3, float(diff.max())
