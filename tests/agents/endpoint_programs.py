"""Agent programs for the endpoint tests (``rollout.agent_server.program: tests.agents.endpoint_programs:<name>``).

Each keeps what the endpoint answered it (:data:`SEEN`, and with ``RLHFCTL_TEST_ENDPOINT_RECORDS`` set, one JSON line
per run in that file), so a test can hold the tokens the server handed out against the trajectory that trained.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any

from rlhfctl.agents.endpoint.client import EndpointClient, EndpointHTTPError

SEEN: list[dict[str, Any]] = []
"""One entry per finished run: the sample and the responses it got."""
ACTIVE = {"now": 0, "most": 0}
LOCK = threading.Lock()
RECORDS_ENV = "RLHFCTL_TEST_ENDPOINT_RECORDS"


def keep(sample: dict[str, Any], responses: list[Any], **extra: Any) -> None:
    """Remember one run (thread-safe: every run has a thread of its own)."""
    entry = {"sample": sample, "responses": responses, **extra}
    with LOCK:
        SEEN.append(entry)
        path = os.environ.get(RECORDS_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(entry, default=str) + "\n")


def question(sample: dict[str, Any]) -> str:
    return str(sample.get("prompt_text") or sample.get("prompt") or "digits 1 2:")


async def two_turns(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> None:
    """Ask, add a user turn after the answer, ask again; the reward function scores the trajectory."""
    async with EndpointClient(base_url, api_key) as client:
        messages: list[dict[str, Any]] = [{"role": "user", "content": question(sample)}]
        first = await client.chat(messages, model=model, return_token_ids=True, logprobs=True)
        messages += [first["choices"][0]["message"], {"role": "user", "content": "again"}]
        second = await client.chat(messages, model=model, return_token_ids=True, logprobs=True)
    keep(sample, [first, second])
    return None


async def rewarded(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> float:
    """One turn; the reward is the answer's length / 10."""
    async with EndpointClient(base_url, api_key) as client:
        reply = await client.chat([{"role": "user", "content": question(sample)}], return_token_ids=True)
    keep(sample, [reply])
    return len(reply["choices"][0]["message"]["content"] or "") / 10


async def shapes(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> float:
    """Every route once: models, chat, a streamed chat, completions (text and token ids), a streamed completion."""
    async with EndpointClient(base_url, api_key) as client:
        status, models = await client.request("GET", "/models")
        chat = await client.chat([{"role": "user", "content": "hi"}], logprobs=True, return_token_ids=True)
        status_stream, stream = await client.request("POST", "/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": {"include_usage": True}})
        text = await client.complete("digits 3:", max_tokens=4, logprobs=1, return_token_ids=True)
        ids = await client.complete([71, 76, 74], max_tokens=3, return_token_ids=True)
        _, text_stream = await client.request("POST", "/completions", {"prompt": "x", "max_tokens": 2, "stream": True})
    keep(sample, [models, chat, stream, text, ids, text_stream], statuses=[status, status_stream])
    return 1.0


async def raises(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> float:
    """One request, then a bug."""
    async with EndpointClient(base_url, api_key) as client:
        await client.chat([{"role": "user", "content": question(sample)}])
    raise ValueError("no answer found")


async def hangs(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> float:
    """One request, then waits forever (cancellable)."""
    async with EndpointClient(base_url, api_key) as client:
        await client.chat([{"role": "user", "content": question(sample)}])
    await asyncio.sleep(3600)
    return 1.0


async def blocks(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> float:
    """Blocks its thread in a synchronous call for ``sample['block_s']`` seconds (not cancellable)."""
    time.sleep(float(sample.get("block_s", 1.0)))
    return 1.0


async def counted(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> float:
    """Two requests while counting the programs running at once."""
    with LOCK:
        ACTIVE["now"] += 1
        ACTIVE["most"] = max(ACTIVE["most"], ACTIVE["now"])
    try:
        async with EndpointClient(base_url, api_key) as client:
            messages: list[dict[str, Any]] = [{"role": "user", "content": question(sample)}]
            first = await client.chat(messages)
            await client.chat([*messages, first["choices"][0]["message"], {"role": "user", "content": "more"}])
        await asyncio.sleep(0.02)
    finally:
        with LOCK:
            ACTIVE["now"] -= 1
    return 0.5


async def retries_on_429(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> float:
    """One chat request, retried every 50 ms while the endpoint answers 429."""
    statuses = []
    async with EndpointClient(base_url, api_key) as client:
        for _ in range(200):
            status, body = await client.request("POST", "/chat/completions", {"messages": [{"role": "user", "content": "q"}]})
            statuses.append(status)
            if status != 429:
                break
            await asyncio.sleep(0.05)
    keep(sample, [body], statuses=statuses)
    return 1.0


async def waits_then_asks(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> float:
    """Sleeps ``sample['delay_s']`` before its one request; keeps the status (a 504 is expected of the other)."""
    await asyncio.sleep(float(sample.get("delay_s", 0.0)))
    async with EndpointClient(base_url, api_key) as client:
        try:
            reply = await client.chat([{"role": "user", "content": "q"}])
            status = 200
        except EndpointHTTPError as problem:
            reply, status = problem.body, problem.status
    keep(sample, [reply], statuses=[status])
    return 1.0


async def branches(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> None:
    """Asks, asks something else (a divergent request), then goes on from the first answer."""
    async with EndpointClient(base_url, api_key) as client:
        first = await client.chat([{"role": "user", "content": "first"}], return_token_ids=True)
        other = await client.chat([{"role": "user", "content": "other"}], return_token_ids=True)
        messages = [{"role": "user", "content": "first"}, first["choices"][0]["message"], {"role": "user", "content": "next"}]
        third = await client.chat(messages, return_token_ids=True)
    keep(sample, [first, other, third])
    return None


async def keeps_asking(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> None:
    """Asks ``sample['asks']`` times in one conversation (past the turn budget)."""
    async with EndpointClient(base_url, api_key) as client:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        replies = []
        for _ in range(int(sample.get("asks", 3))):
            reply = await client.chat(messages)
            replies.append(reply)
            messages += [reply["choices"][0]["message"], {"role": "user", "content": "on"}]
    keep(sample, replies)
    return None


async def uses_echo(*, base_url: str, api_key: str, model: str, sample: dict[str, Any]) -> float:
    """Offers an echo tool, runs the call the model makes, sends its output back as a tool message."""
    tools = [{"type": "function", "function": {"name": "echo", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}]
    async with EndpointClient(base_url, api_key) as client:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "use echo"}]
        first = await client.chat(messages, tools=tools, return_token_ids=True)
        message = first["choices"][0]["message"]
        messages.append(message)
        for call in message.get("tool_calls") or []:
            arguments = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"echo:{arguments['text']}"})
        second = await client.chat(messages, tools=tools, return_token_ids=True)
    keep(sample, [first, second])
    return 1.0
