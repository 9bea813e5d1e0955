"""A chat demonstration as tokens and a loss mask: every assistant turn is learned, every other turn is context.

:class:`ChatLayout` lays a chat out as an agent rollout lays out a trajectory (``rlhfctl.agents``): the
**prompt** (everything the template renders before the first assistant turn, its role header included),
then the **response**, every later token, with ``response_mask`` 1 on the tokens the policy writes and 0
on the context between them (user, system and tool turns, and each assistant turn's role header).

The rule, for each assistant message (``content`` and/or OpenAI ``tool_calls``): its labels are the
tokens the chat template renders for it after its role header, then the end-of-sequence token (where
a rollout stops generating); the template's turn end is context after it:

- a template whose turn end begins with the end-of-sequence token (ChatML's ``<|im_end|>\\n``, the
  eos of Qwen's chat models) has it learned where it renders it, and the rest (the newline) is context;
- a template whose turn end does not (the character tokenizer's ``role: content\\n``) gets the
  end-of-sequence token right after the message, and its whole turn end follows as context.

This is the layout an agent rollout gives a trajectory (:mod:`rlhfctl.agents.chat_turns`: the engine
stops on the eos token, and the rest of the turn end opens the next context), so the warm start
teaches the policy the turns the rollout will ask of it.

A single-turn chat therefore gives the prompt rendered with the generation prompt and the response
``content + <eos>``, as SFT always did. The template's turn end is what it renders after an assistant
message's content, measured once per dataset (:func:`turn_end`).

Spans come from rendering the chat prefix by prefix (up to each assistant message with the generation
prompt, then through it): each rendering must be a prefix of the whole chat's rendering, else the
template rewrites earlier turns (e.g. drops past reasoning) and the chat is refused with
:class:`ChatLayoutError`. The text pieces are tokenized one by one (the prompt, each turn's content,
each turn end, each stretch of context), so a turn's tokens do not depend on its neighbours, and a
prompt and its response are tokenized apart, as before. Tokens after the last assistant turn are
dropped: nothing follows them to learn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ChatLayout", "ChatLayoutError", "ChatTokens", "check_chat", "turn_end"]

_PROBE = "PROBE-turn-end-7e1f"
"""The content of the assistant message rendered to find the template's turn end."""


class ChatLayoutError(ValueError):
    """A chat (or a chat template) cannot be laid out in turns; the reader adds the source and record."""


@dataclass(frozen=True)
class ChatTokens:
    """A chat's prompt ids, response ids and response mask (1 on the assistant turns' labels)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]


def _has_tool_calls(message: Mapping[str, Any]) -> bool:
    calls = message.get("tool_calls")
    return isinstance(calls, (list, tuple)) and len(calls) > 0


def check_chat(messages: Any) -> None:
    """The chat's shape: a list of ``{role, content}`` messages (an assistant's content may be left out when it
    has ``tool_calls``), opening with a non-assistant message and ending with an assistant turn."""
    if not isinstance(messages, (list, tuple)) or len(messages) < 2:
        raise ChatLayoutError("the chat must be a list of at least two {role, content} messages")
    for position, message in enumerate(messages, start=1):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ChatLayoutError(f"message {position} must be a mapping with 'role' and 'content'")
        if message["role"] == "assistant":
            content = message.get("content")
            if not _has_tool_calls(message) and (not isinstance(content, str) or not content):
                raise ChatLayoutError(f"message {position} (assistant) has neither text content nor tool_calls")
        elif "content" not in message:
            raise ChatLayoutError(f"message {position} must be a mapping with 'role' and 'content'")
    roles = [message["role"] for message in messages]
    if "assistant" not in roles:
        raise ChatLayoutError(
            f"the chat has no assistant message (roles: {', '.join(roles)}), so nothing to learn; the last message "
            "must be the assistant's reply"
        )
    if roles[-1] != "assistant":
        raise ChatLayoutError(
            f"the last message must be the assistant's, got role {roles[-1]!r}; end the chat with the assistant's "
            "reply (messages after it would be context with nothing to learn)"
        )
    if roles[0] == "assistant":
        raise ChatLayoutError("the chat opens with an assistant message; put the system or user message it answers first")


def _renderer(tokenizer: Any, tools: Sequence[Any] | None) -> Callable[[Sequence[Mapping[str, Any]], bool], str]:
    extra = {"tools": list(tools)} if tools else {}

    def render(messages: Sequence[Mapping[str, Any]], generation_prompt: bool) -> str:
        try:
            return tokenizer.apply_chat_template(list(messages), add_generation_prompt=generation_prompt,
                                                 tokenize=False, **extra)
        except Exception as error:  # jinja's errors (a template's raise_exception included) have no common base
            raise ChatLayoutError(f"the chat template cannot render messages 1-{len(messages)}: {error}") from error

    return render


def turn_end(tokenizer: Any) -> str:
    """What the tokenizer's chat template renders after an assistant message's content (its end of turn)."""
    render = _renderer(tokenizer, None)
    user = [{"role": "user", "content": "x"}]
    header = render(user, True)
    whole = render([*user, {"role": "assistant", "content": _PROBE}], False)
    if not whole.startswith(header) or _PROBE not in whole[len(header):]:
        raise ChatLayoutError(
            "the chat template does not render an assistant message's content after the generation prompt, so its "
            "turns cannot be found; use a tokenizer whose chat template does (model.tokenizer_path)"
        )
    return whole[len(header):].rpartition(_PROBE)[2]


def _prefix_of(text: str, whole: str, messages: int, generation_prompt: bool) -> int:
    if not whole.startswith(text):
        upto = f"messages 1-{messages}" + (" with the generation prompt" if generation_prompt else "")
        raise ChatLayoutError(
            f"the chat template does not render prefixes stably: {upto} is not a prefix of the whole chat's rendering "
            "(the template rewrites earlier turns, e.g. drops past reasoning), so the assistant turns cannot be "
            "located; use a tokenizer whose template renders each message the same wherever it is "
            "(model.tokenizer_path), or give one assistant reply per record"
        )
    return len(text)


class ChatLayout:
    """Lays out a tokenizer's chats; the template's turn end is measured once, on first use."""

    def __init__(self, tokenizer: Any, encode: Callable[[str], list[int]], eos: int) -> None:
        self.tokenizer, self.encode, self.eos = tokenizer, encode, int(eos)
        self._end: tuple[str, list[int], list[int]] | None = None

    def _turn_end(self) -> tuple[str, list[int], list[int]]:
        """The turn end's text, its learned part (the end-of-sequence token) and the context after it."""
        if self._end is None:
            text = turn_end(self.tokenizer)
            ids = self.encode(text)
            self._end = (text, [self.eos], ids[1:] if ids[:1] == [self.eos] else ids)
        return self._end

    def tokens(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> ChatTokens:
        """A checked chat (:func:`check_chat`) as prompt, response and response mask (see the module doc)."""
        render = _renderer(self.tokenizer, tools)
        end, learned_end, context_end = self._turn_end()
        whole = render(messages, False)
        prompt: list[int] | None = None
        response: list[int] = []
        mask: list[int] = []

        def add(ids: list[int], learned: int) -> None:
            response.extend(ids)
            mask.extend([learned] * len(ids))

        cursor = 0
        for position, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            start = _prefix_of(render(messages[:position], True), whole, position, True)
            stop = _prefix_of(render(messages[: position + 1], False), whole, position + 1, False)
            body = whole[start:stop]
            if start < cursor or not body.endswith(end):
                raise ChatLayoutError(
                    f"the chat template ends assistant message {position + 1} with {body[-len(end) - 8:]!r}, not "
                    f"with its turn end {end!r}; use a tokenizer whose template ends every assistant turn alike (model.tokenizer_path)"
                )
            context = self.encode(whole[cursor:start])
            if prompt is None:
                prompt = context
            else:
                add(context, 0)
            add(self.encode(body[: len(body) - len(end)]) + learned_end, 1)
            add(context_end, 0)
            cursor = stop
        while mask and mask[-1] == 0:  # the last turn's trailing context: nothing after it to learn
            mask.pop()
            response.pop()
        if prompt is None:
            raise ChatLayoutError("the chat has no assistant message, so nothing to learn")
        return ChatTokens(prompt, response, mask)
