"""The tokens of a turn the policy did not write: a tool output (or an observation) in the chat template's wrapper.

The wrapper is read off the chat template itself, as the difference between a fixed two-message chat
(a user turn, an assistant turn) rendered as it is and rendered with the new messages and the next
generation prompt after it::

    tokens = encode(tail + rendered(base + new, generation prompt)[len(rendered(base)):])

``tail`` is what the template writes after an assistant message's content (``<|im_end|>\\n`` in
ChatML, ``\\n`` in the character tokenizer's ``role: content`` template). The engine already
generated the part of it that is the EOS token it stopped on, so only the rest is added: for ChatML
``\\n``; for a turn cut by ``max_new_tokens`` (no EOS) the whole tail. The assistant's own tokens are
never re-rendered: only the new turn's text is tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ChatTurns"]

_MARK = "agent-turn-9f3c"
_BASE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]


class ChatTurns:
    """Tokenizes the turns between two assistant turns with the wrapper the tokenizer's chat template gives them."""

    def __init__(self, tokenizer: Any, eos_ids: Sequence[int]) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "rollout.multi_turn needs a tokenizer with a chat template (the wrapper of tool turns is read from it)"
            )
        self.tokenizer = tokenizer
        self.base = self._render(_BASE, generation_prompt=False)
        where = self.base.rfind(_MARK)
        if where < 0:
            raise ValueError("the chat template does not render an assistant message's content")
        self.tail = self.base[where + len(_MARK):]
        self.eos_texts = {int(eos): tokenizer.decode([int(eos)], skip_special_tokens=False) for eos in eos_ids}

    def _render(self, messages: list[dict[str, Any]], *, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def text(self, messages: Sequence[dict[str, Any]], last_token: int | None) -> str:
        """The text after an assistant turn that ended on ``last_token``: the rest of its tail, the
        ``messages`` in their wrapper, and the next generation prompt."""
        full = self._render([*_BASE, *messages], generation_prompt=True)
        if not full.startswith(self.base):
            raise ValueError(
                "the chat template renders earlier messages differently once a tool turn follows, so the tool "
                "turn's tokens cannot be read off it; write an AgentLoop for this template"
            )
        tail = self.tail
        eos_text = self.eos_texts.get(int(last_token)) if last_token is not None else None
        if eos_text and tail.startswith(eos_text):
            tail = tail[len(eos_text):]
        return tail + full[len(self.base):]

    def token_ids(self, messages: Sequence[dict[str, Any]], last_token: int | None) -> list[int]:
        """:meth:`text`, tokenized (no special tokens added)."""
        return list(self.tokenizer.encode(self.text(messages, last_token), add_special_tokens=False))

    def cut(self, text: str, max_tokens: int) -> str:
        """``text`` cut to its first ``max_tokens`` tokens (``max_tool_response_tokens``)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= max_tokens:
            return text
        return self.tokenizer.decode(ids[:max_tokens], skip_special_tokens=False)
