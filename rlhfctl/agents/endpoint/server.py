"""The endpoint: ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` per trajectory session, on 127.0.0.1.

Each trajectory gets a session and its own base URL, ``http://127.0.0.1:<port>/s/<session>/v1``; every request
needs ``Authorization: Bearer <token>``, a random token of this endpoint (HTTP 401 without it). A request's tokens:

- **chat**: the messages rendered with the tokenizer's chat template (``tools`` included) and tokenized, except
  when they repeat the session's chain (its last request's messages and the assistant message returned for it) and
  add turns after it: then the prompt is the chain's own tokens, exactly as sampled, and only the new turns are
  rendered, in the template's wrapper (:class:`~rlhfctl.agents.chat_turns.ChatTurns`). So the policy's earlier
  turns are never re-tokenized, and the next request extends the chain.
- **completions**: token-id prompts as they are; a text prompt that starts with the chain's text (the last prompt
  and the text returned) is the chain's tokens plus the rest tokenized; other text is tokenized whole.

The answer's text is the sampled tokens decoded (EOS and special tokens dropped), cut at the first ``stop`` string;
with ``tools`` in a chat request, the recipe's tool-call parser (``rollout.agent_server.tool_format``) turns the
calls in it into OpenAI ``tool_calls`` (``finish_reason: "tool_calls"``); a call the parser cannot read leaves the
whole text as the content. The session records every request (:mod:`rlhfctl.agents.endpoint.session`).

Bounded: at most ``queue_size`` requests wait for the engine (more get HTTP 429, ``Retry-After: 1``), each at most
``request_timeout_s`` (HTTP 504); a program runs at most ``trajectory_timeout_s``
(:mod:`rlhfctl.agents.endpoint.program`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from rlhfctl.agents.chat_turns import ChatTurns
from rlhfctl.agents.endpoint.http_server import HOST, HttpRequest, HttpResponse, HttpServer, NoFreePort
from rlhfctl.agents.endpoint.openai_format import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    assistant_message,
    chat_completion,
    chat_stream,
    messages_key,
    model_list,
    normalize_message,
    read_chat_request,
    read_completion_request,
    text_completion,
    text_stream,
)
from rlhfctl.agents.endpoint.program import Program, ProgramOutcome, run_program
from rlhfctl.agents.endpoint.session import Admission, RequestRecord, Session
from rlhfctl.agents.endpoint.settings import MODEL_NAME, EndpointSettings
from rlhfctl.agents.llm import LLM
from rlhfctl.agents.loop import AgentSample
from rlhfctl.agents.tool_calls import tool_call_parser
from rlhfctl.agents.trajectory import Trajectory
from rlhfctl.protocol import plain_value
from rlhfctl.recipe.errors import RecipeError

__all__ = ["AgentEndpoint", "EndpointRun", "plain_columns"]


@dataclass(frozen=True)
class EndpointRun:
    """One trajectory's program run: the trajectory (from the recorded tokens), how the program ended, every request."""

    trajectory: Trajectory
    outcome: ProgramOutcome
    records: list[RequestRecord]


class _Sampled(NamedTuple):
    token_ids: list[int]
    log_probs: list[float]
    finished: bool
    """Ended on an EOS token."""
    finish_reason: str
    text: str


def plain_columns(columns: Mapping[str, Any]) -> dict[str, Any]:
    """A sample's dataset columns as plain Python values (NumPy arrays and scalars converted), as a program gets them."""
    return {str(key): plain_value(value) for key, value in columns.items()}


class AgentEndpoint:
    """An OpenAI-compatible endpoint over one engine, one session per trajectory (see the module docstring).

    Use it as ``async with AgentEndpoint(...) as endpoint:`` and run each trajectory with :meth:`run_trajectory`
    (or :meth:`open_session` / :meth:`close_session` around a program you run yourself).
    """

    def __init__(self, tokenizer: Any, eos_ids: Sequence[int], settings: EndpointSettings, chat: ChatTurns | None = None) -> None:
        self.tokenizer, self.eos_ids, self.settings = tokenizer, [int(eos) for eos in eos_ids], settings
        self.chat = chat if chat is not None or not getattr(tokenizer, "chat_template", None) else ChatTurns(tokenizer, eos_ids)
        self.parse = tool_call_parser(settings.tool_format)
        self.token = secrets.token_urlsafe(24)
        """The bearer token every request must carry (a program gets it as ``api_key``)."""
        self.sessions: dict[str, tuple[Session, LLM]] = {}
        self.waiting = 0
        """Requests waiting for the engine now."""
        self.http = HttpServer(self._handle, idle_timeout_s=settings.trajectory_timeout_s)

    # ------------------------------------------------------------------ lifetime
    async def __aenter__(self) -> "AgentEndpoint":
        try:
            await self.http.start(self.settings.port_range)
        except NoFreePort as problem:
            raise RecipeError(f"rollout.agent_server.port_range: {problem}; widen the range or set it to null (a free "
                              "port the OS picks)", "rollout.agent_server.port_range") from None
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.http.close()

    @property
    def port(self) -> int:
        """The port served (after start)."""
        if self.http.port is None:
            raise RuntimeError("the endpoint is not serving; use it as 'async with AgentEndpoint(...)'")
        return self.http.port

    def base_url(self, session_id: str) -> str:
        """The ``.../v1`` URL of one session."""
        return f"http://{HOST}:{self.port}/s/{session_id}/v1"

    def open_session(self, llm: LLM, *, fallback_prompt_ids: Sequence[int], prompt_width: int | None = None,
                     context_limit: int | None = None) -> Session:
        """A new session whose requests sample through ``llm``; ``prompt_width`` is the rollout batch's prompt columns
        (a wider first prompt overflows into the response), ``context_limit`` the engine's tokens per sequence."""
        session = Session(
            secrets.token_hex(8), fallback_prompt_ids=list(fallback_prompt_ids), max_response_tokens=self.settings.max_response_tokens,
            max_turns=self.settings.max_turns, prompt_width=prompt_width, context_limit=context_limit,
        )
        self.sessions[session.session_id] = (session, llm)
        return session

    def close_session(self, session: Session) -> None:
        """End a session: later requests under it get HTTP 404, and it records nothing more."""
        self.sessions.pop(session.session_id, None)
        session.closed = True

    async def run_trajectory(self, program: Program, sample: AgentSample, llm: LLM, *, prompt_width: int | None = None,
                             context_limit: int | None = None) -> EndpointRun:
        """Run ``program`` once for ``sample`` against a session of its own; the trajectory its requests made."""
        session = self.open_session(llm, fallback_prompt_ids=sample.prompt_ids, prompt_width=prompt_width, context_limit=context_limit)
        wall = time.time()
        arguments = {"base_url": self.base_url(session.session_id), "api_key": self.token, "model": MODEL_NAME,
                     "sample": plain_columns(sample.columns)}
        try:
            outcome = await run_program(program, arguments, self.settings.trajectory_timeout_s)
        finally:
            self.close_session(session)
        trajectory = session.finish(reward=outcome.reward, error=outcome.error, timed_out=outcome.timed_out, seconds=outcome.seconds)
        trajectory.spans.append(("agent.program", wall, time.time()))
        return EndpointRun(trajectory, outcome, list(session.records))

    # ------------------------------------------------------------------ requests
    async def _handle(self, request: HttpRequest) -> HttpResponse:
        try:
            if not secrets.compare_digest(request.headers.get("authorization", "").encode(), f"Bearer {self.token}".encode()):
                raise ApiError(401, "a valid API key is required: Authorization: Bearer <the api_key the program was given>",
                               code="invalid_api_key")
            session, llm, route = self._route(request)
            if route == "models":
                return HttpResponse.json(200, model_list(MODEL_NAME))
            try:
                body = request.json()
            except ValueError as problem:
                raise ApiError(400, f"the request body is not JSON: {problem}") from None
            if route == "chat/completions":
                return await self._chat(session, llm, read_chat_request(body))
            return await self._completions(session, llm, read_completion_request(body))
        except ApiError as problem:
            headers = (("Retry-After", "1"),) if problem.status == 429 else ()
            return HttpResponse.json(problem.status, problem.body(), headers)

    def _route(self, request: HttpRequest) -> tuple[Session, LLM, str]:
        parts = request.path.strip("/").split("/")
        if len(parts) < 4 or parts[0] != "s" or parts[2] != "v1":
            raise ApiError(404, f"no such path {request.path!r}; use the base_url the program was given", code="not_found")
        route = "/".join(parts[3:])
        methods = {"chat/completions": "POST", "completions": "POST", "models": "GET"}
        if route not in methods:
            raise ApiError(404, f"no such endpoint /v1/{route}; served: {', '.join('/v1/' + name for name in methods)}", code="not_found")
        if request.method != methods[route]:
            raise ApiError(405, f"/v1/{route} takes {methods[route]}, got {request.method}")
        entry = self.sessions.get(parts[1])
        if entry is None:
            raise ApiError(404, f"session {parts[1]!r} has ended or never existed (a session lives while its program runs)",
                           code="session_not_found")
        return entry[0], entry[1], route

    async def _chat(self, session: Session, llm: LLM, request: ChatRequest) -> HttpResponse:
        prompt_ids = self._chat_prompt(session, request)
        admission = self._admit(session, prompt_ids)
        sampled = await self._sample(session, llm, prompt_ids, admission, request.max_tokens, request.stop)
        content, calls = sampled.text, []
        if request.parse_tools and sampled.token_ids:
            parsed = self.parse(sampled.text)
            calls = [call for call in parsed.calls if call.error is None]
            malformed = len(parsed.calls) - len(calls)
            session.counts["tool_calls"] += len(calls)
            session.counts["malformed_tool_calls"] += malformed
            content = sampled.text if malformed else parsed.content
        ids = [f"call_{session.session_id}_{len(session.records)}_{index}" for index in range(len(calls))]
        message = assistant_message(content, calls, ids)
        finish = "tool_calls" if calls and sampled.finish_reason != "length" else sampled.finish_reason
        session.record("chat", admission, prompt_ids, sampled.token_ids, sampled.log_probs, finished=sampled.finished,
                       finish_reason=finish, chain_messages=[*request.messages, normalize_message(message)])
        logprobs = [self._logprob_entry(token, value) for token, value in zip(sampled.token_ids, sampled.log_probs)] if request.logprobs else None
        response = chat_completion(
            request_id=f"chatcmpl-{secrets.token_hex(8)}", created=int(time.time()), model=MODEL_NAME, message=message,
            finish_reason=finish, prompt_ids=prompt_ids, token_ids=sampled.token_ids, logprobs=logprobs,
            return_token_ids=request.return_token_ids,
        )
        if request.stream:
            return HttpResponse(200, chat_stream(response, request.include_usage), "text/event-stream")
        return HttpResponse.json(200, response)

    async def _completions(self, session: Session, llm: LLM, request: CompletionRequest) -> HttpResponse:
        prompt_ids = self._completion_prompt(session, request)
        admission = self._admit(session, prompt_ids)
        sampled = await self._sample(session, llm, prompt_ids, admission, request.max_tokens, request.stop)
        chain_text = request.prompt + sampled.text if isinstance(request.prompt, str) else None
        session.record("completions", admission, prompt_ids, sampled.token_ids, sampled.log_probs, finished=sampled.finished,
                       finish_reason=sampled.finish_reason, chain_text=chain_text)
        logprobs = self._text_logprobs(sampled) if request.logprobs else None
        response = text_completion(
            request_id=f"cmpl-{secrets.token_hex(8)}", created=int(time.time()), model=MODEL_NAME, text=sampled.text,
            finish_reason=sampled.finish_reason, prompt_ids=prompt_ids, token_ids=sampled.token_ids, logprobs=logprobs,
            return_token_ids=request.return_token_ids,
        )
        if request.stream:
            return HttpResponse(200, text_stream(response, request.include_usage), "text/event-stream")
        return HttpResponse.json(200, response)

    # ------------------------------------------------------------------ tokens
    def _chat_prompt(self, session: Session, request: ChatRequest) -> list[int]:
        """The chain's tokens plus the new turns when the request repeats the chain, else the whole render."""
        if self.chat is None:
            raise ApiError(400, "the policy's tokenizer has no chat template: use /v1/completions")
        chain = session.chain_messages
        if (chain is not None and session.trajectory is not None and len(request.messages) > len(chain)
                and request.add_generation_prompt and not request.continue_final_message
                and messages_key(request.messages[: len(chain)]) == messages_key(chain)):
            try:
                return session.trajectory.context_ids + self.chat.token_ids(request.messages[len(chain):], session.last_token)
            except ValueError:
                pass  # the template renders earlier turns differently once these follow: render the whole chat
        options: dict[str, Any] = {"tokenize": False, "add_generation_prompt": request.add_generation_prompt and not request.continue_final_message}
        if request.continue_final_message:
            options["continue_final_message"] = True
        if request.tools:
            options["tools"] = request.tools
        try:
            text = self.tokenizer.apply_chat_template(request.messages, **options)
        except Exception as problem:  # the template's own checks (roles, alternation) speak to the program
            raise ApiError(400, f"the chat template cannot render these messages: {type(problem).__name__}: {problem}") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _completion_prompt(self, session: Session, request: CompletionRequest) -> list[int]:
        if isinstance(request.prompt, list):
            size = len(self.tokenizer)
            if any(token < 0 or token >= size for token in request.prompt):
                raise ApiError(400, f"prompt token ids must be in 0..{size - 1}", param="prompt")
            return list(request.prompt)
        chain = session.chain_text
        if chain is not None and session.trajectory is not None and request.prompt.startswith(chain):
            rest = request.prompt[len(chain):]
            return session.trajectory.context_ids + list(self.tokenizer.encode(rest, add_special_tokens=False))
        return list(self.tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens))

    def _admit(self, session: Session, prompt_ids: list[int]) -> Admission:
        admission = session.admit(prompt_ids)
        if admission.kind == "too_long":
            raise ApiError(400, f"the prompt's {len(prompt_ids)} tokens leave no room to sample within this trajectory's "
                                "context (rollout.multi_turn.max_response_tokens after the batch's prompt width)",
                           code="context_length_exceeded", param="messages")
        return admission

    async def _sample(self, session: Session, llm: LLM, prompt_ids: list[int], admission: Admission,
                      requested: int | None, stops: list[str]) -> _Sampled:
        if admission.kind == "spent":
            return _Sampled([], [], False, "length", "")
        if self.waiting >= self.settings.queue_size:
            session.counts["rejected_requests"] += 1
            raise ApiError(429, f"{self.waiting} requests already wait for the engine (rollout.agent_server.queue_size); retry",
                           kind="rate_limit_exceeded", code="queue_full")
        budget = min(admission.max_tokens, self.settings.max_new_tokens, requested or admission.max_tokens)
        self.waiting += 1
        task = asyncio.ensure_future(llm.generate(prompt_ids, max_tokens=budget))
        task.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved even if nobody waits
        try:
            generation = await asyncio.wait_for(asyncio.shield(task), self.settings.request_timeout_s)
        except asyncio.TimeoutError:
            session.counts["request_timeouts"] += 1
            raise ApiError(504, f"no tokens within {self.settings.request_timeout_s:g} s (rollout.agent_server.request_timeout_s)",
                           kind="timeout", code="request_timeout") from None
        except Exception as problem:  # the engine's failure: the rollout raises it once the programs are done
            raise ApiError(500, f"{type(problem).__name__}: {problem}", kind="server_error") from None
        finally:
            self.waiting -= 1
        tokens, log_probs = list(generation.token_ids)[:budget], list(generation.log_probs)[:budget]
        finished = generation.finished and len(tokens) == len(generation.token_ids)
        reason = "stop" if finished else "length"
        text = self._decode(tokens)
        cut = self._stop_at(tokens, text, stops)
        if cut is not None:
            keep, text = cut
            tokens, log_probs, reason = tokens[:keep], log_probs[:keep], "stop"
            return _Sampled(tokens, log_probs, False, reason, text)
        return _Sampled(tokens, log_probs, finished, reason, text)

    def _decode(self, token_ids: Sequence[int]) -> str:
        kept = [token for token in token_ids if token not in self.eos_ids]
        return self.tokenizer.decode(kept, skip_special_tokens=True)

    def _stop_at(self, tokens: list[int], text: str, stops: list[str]) -> tuple[int, str] | None:
        """Where the first stop string ends: the tokens to keep (up to the one completing it) and the text before it."""
        found = [(text.find(stop), stop) for stop in stops if stop in text]
        if not found:
            return None
        position, stop = min(found)
        end = position + len(stop)
        low, high = 1, len(tokens)
        while low < high:  # the fewest tokens whose text holds the whole stop string
            middle = (low + high) // 2
            if len(self._decode(tokens[:middle])) >= end:
                high = middle
            else:
                low = middle + 1
        return low, text[:position]

    def _logprob_entry(self, token: int, value: float) -> dict[str, Any]:
        piece = self.tokenizer.decode([token], skip_special_tokens=False)
        return {"token": piece, "logprob": float(value), "bytes": list(piece.encode("utf-8")), "top_logprobs": []}

    def _text_logprobs(self, sampled: _Sampled) -> dict[str, Any]:
        pieces = [self.tokenizer.decode([token], skip_special_tokens=False) for token in sampled.token_ids]
        offsets, at = [], 0
        for piece in pieces:
            offsets.append(at)
            at += len(piece)
        return {"tokens": pieces, "token_logprobs": [float(value) for value in sampled.log_probs], "top_logprobs": None, "text_offset": offsets}
