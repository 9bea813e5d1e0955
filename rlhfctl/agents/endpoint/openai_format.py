"""The OpenAI wire format the endpoint speaks: requests read and checked, responses and stream events written.

Read from a request: ``messages`` (text content, or text parts), ``tools``, ``tool_choice`` (``"none"`` turns
tool-call parsing off), ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``logprobs``, ``stream`` (with
``stream_options.include_usage``), and the vLLM extensions ``return_token_ids``, ``add_generation_prompt``,
``continue_final_message`` and, for completions, ``add_special_tokens``. Sampling settings (``temperature``,
``top_p``, ``seed``, ...) are accepted and ignored: every request samples with the rollout's settings, the
distribution the policy is trained on. ``n`` above 1, ``best_of`` above 1, ``echo`` and non-text content parts are
refused (HTTP 400).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlhfctl.agents.tool_calls import ToolCall

__all__ = [
    "ApiError",
    "ChatRequest",
    "CompletionRequest",
    "assistant_message",
    "chat_completion",
    "chat_stream",
    "messages_key",
    "model_list",
    "normalize_message",
    "read_chat_request",
    "read_completion_request",
    "text_completion",
    "text_stream",
]


class ApiError(Exception):
    """A request the endpoint answers with an OpenAI error body and ``status``."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = int(status), message, kind, code, param

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ChatRequest:
    """What a ``/v1/chat/completions`` request asks for (messages normalized by :func:`normalize_message`)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    max_tokens: int | None
    stop: list[str]
    logprobs: bool
    stream: bool
    include_usage: bool
    return_token_ids: bool
    add_generation_prompt: bool
    continue_final_message: bool


@dataclass(frozen=True)
class CompletionRequest:
    """What a ``/v1/completions`` request asks for: a text prompt, or token ids used as they are."""

    prompt: str | list[int]
    max_tokens: int
    stop: list[str]
    logprobs: bool
    stream: bool
    include_usage: bool
    return_token_ids: bool
    add_special_tokens: bool


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _common(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields chat and completions share: n, best_of, max_tokens, stop, stream."""
    for key in ("n", "best_of"):
        if body.get(key) not in (None, 1):
            raise ApiError(400, f"{key}={body.get(key)!r}: one sample per request; send several requests instead", param=key)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise ApiError(400, f"max_tokens must be a positive integer, got {max_tokens!r}", param="max_tokens")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not all(isinstance(item, str) and item for item in stops):
        raise ApiError(400, f"stop must be a string or a list of non-empty strings, got {stop!r}", param="stop")
    options = body.get("stream_options") or {}
    return {
        "max_tokens": max_tokens,
        "stop": stops,
        "stream": bool(body.get("stream")),
        "include_usage": bool(isinstance(options, Mapping) and options.get("include_usage")),
        "return_token_ids": bool(body.get("return_token_ids")),
    }


def read_chat_request(body: Any) -> ChatRequest:
    """A chat completions request, checked; :class:`ApiError` (400) naming the field otherwise."""
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(tool, Mapping) and isinstance(tool.get("function"), Mapping) and tool["function"].get("name")
            for tool in tools)):
        raise ApiError(400, 'tools must be a list of {"type": "function", "function": {"name": ..., "parameters": {...}}}',
                       param="tools")
    return ChatRequest(
        messages=[normalize_message(message, index) for index, message in enumerate(messages)],
        tools=[dict(tool) for tool in tools] if tools else None,
        parse_tools=bool(tools) and body.get("tool_choice") != "none",
        logprobs=bool(body.get("logprobs")),
        add_generation_prompt=bool(body.get("add_generation_prompt", True)),
        continue_final_message=bool(body.get("continue_final_message", False)),
        **_common(body),
    )


def read_completion_request(body: Any) -> CompletionRequest:
    """A completions request with one prompt (text, or a list of token ids), checked."""
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    is_ids = isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not isinstance(prompt, str) and not is_ids:
        raise ApiError(400, "prompt must be one string or one list of token ids (one prompt per request)", param="prompt")
    if body.get("echo"):
        raise ApiError(400, "echo is not supported", param="echo")
    common = _common(body)
    common["max_tokens"] = 16 if common["max_tokens"] is None else common["max_tokens"]  # OpenAI's default
    return CompletionRequest(
        prompt=prompt if isinstance(prompt, str) else [int(t) for t in prompt],
        logprobs=body.get("logprobs") is not None and body.get("logprobs") is not False,
        add_special_tokens=bool(body.get("add_special_tokens", True)),
        **common,
    )


def normalize_message(message: Any, index: int = 0) -> dict[str, Any]:
    """A message as chat templates take it: text ``content`` ("" for null), ``tool_calls`` with their arguments as
    objects (OpenAI sends JSON strings), ``name`` and ``tool_call_id`` kept."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise ApiError(400, f"messages[{index}] must be an object with a role, got {message!r}"[:300], param="messages")
    content = message.get("content")
    if isinstance(content, list):
        if any(not isinstance(part, Mapping) or part.get("type") not in ("text", "input_text") for part in content):
            raise ApiError(400, f"messages[{index}].content: only text parts are supported", param="messages")
        content = "".join(str(part.get("text", "")) for part in content)
    elif content is not None and not isinstance(content, str):
        raise ApiError(400, f"messages[{index}].content must be a string or a list of text parts", param="messages")
    normal: dict[str, Any] = {"role": message["role"], "content": content or ""}
    calls = message.get("tool_calls")
    if calls:
        normal["tool_calls"] = [_call_for_template(call, index) for call in calls]
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            normal[key] = message[key]
    return normal


def _call_for_template(call: Any, index: int) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ApiError(400, f"messages[{index}].tool_calls: each needs function.name", param="messages")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass  # kept as the model wrote it
    entry: dict[str, Any] = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if call.get("id") is not None:
        entry["id"] = call["id"]
    return entry


def messages_key(messages: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """What must be equal for two normalized message lists to render the same turns (role, content, calls)."""
    def key(message: Mapping[str, Any]) -> tuple[Any, ...]:
        calls = tuple((call["function"]["name"], json.dumps(call["function"]["arguments"], sort_keys=True))
                      for call in message.get("tool_calls") or [])
        return (message["role"], message.get("content") or "", calls, message.get("tool_call_id"))

    return [key(message) for message in messages]


def assistant_message(content: str, calls: Sequence[ToolCall], call_ids: Sequence[str]) -> dict[str, Any]:
    """The OpenAI assistant message: ``content`` (null when only tool calls) and ``tool_calls`` with arguments as JSON text."""
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments))}}
            for call, call_id in zip(calls, call_ids)
        ]
    return message


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def chat_completion(*, request_id: str, created: int, model: str, message: dict[str, Any], finish_reason: str,
                    prompt_ids: list[int], token_ids: list[int], logprobs: list[dict[str, Any]] | None,
                    return_token_ids: bool) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice (``logprobs``: the ``content`` entries, when asked for)."""
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason,
                              "logprobs": {"content": logprobs} if logprobs is not None else None}
    response: dict[str, Any] = {"id": request_id, "object": "chat.completion", "created": created, "model": model,
                                "choices": [choice], "usage": _usage(len(prompt_ids), len(token_ids))}
    if return_token_ids:
        response["prompt_token_ids"], choice["token_ids"] = list(prompt_ids), list(token_ids)
    return response


def chat_stream(response: dict[str, Any], include_usage: bool) -> bytes:
    """A finished chat completion as server-sent events: one delta with the whole message, the finish, ``[DONE]``."""
    choice = response["choices"][0]
    delta = {key: value for key, value in choice["message"].items() if value is not None}
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": index, **call} for index, call in enumerate(delta["tool_calls"])]
    head = {key: response[key] for key in ("id", "created", "model")}
    events = [
        {**head, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}]},
        {**head, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
    ]
    if include_usage:
        events.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": response["usage"]})
    return _events(events)


def text_completion(*, request_id: str, created: int, model: str, text: str, finish_reason: str, prompt_ids: list[int],
                    token_ids: list[int], logprobs: dict[str, Any] | None, return_token_ids: bool) -> dict[str, Any]:
    """A ``text_completion`` object with one choice."""
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}
    response: dict[str, Any] = {"id": request_id, "object": "text_completion", "created": created, "model": model,
                                "choices": [choice], "usage": _usage(len(prompt_ids), len(token_ids))}
    if return_token_ids:
        response["prompt_token_ids"], choice["token_ids"] = list(prompt_ids), list(token_ids)
    return response


def text_stream(response: dict[str, Any], include_usage: bool) -> bytes:
    """A finished text completion as server-sent events: the text, then the finish, then ``[DONE]``."""
    choice = response["choices"][0]
    head = {key: response[key] for key in ("id", "object", "created", "model")}
    events = [
        {**head, "choices": [{"index": 0, "text": choice["text"], "logprobs": choice["logprobs"], "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}]},
    ]
    if include_usage:
        events.append({**head, "choices": [], "usage": response["usage"]})
    return _events(events)


def _events(events: list[dict[str, Any]]) -> bytes:
    return "".join(f"data: {json.dumps(event)}\n\n" for event in events).encode() + b"data: [DONE]\n\n"


def model_list(model: str) -> dict[str, Any]:
    """``GET /v1/models``: the one model served."""
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "rlhfctl"}]}
