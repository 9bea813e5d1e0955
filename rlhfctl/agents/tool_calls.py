"""Tool calls in the model's text: the parsers (``rollout.multi_turn.format``) and the argument check.

A parser reads one assistant turn's decoded text and returns the calls it finds: each a
:class:`ToolCall` (a name and a mapping of arguments) or, where the text tries to call a tool and the
call cannot be read, a :class:`ToolCall` with ``error`` set (the model is told what was wrong).

The bundled format is **hermes** (Qwen2.5, Hermes, many tool-use chat templates)::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>

Any number of calls per turn; the text outside them is the turn's content. Register another with
:func:`register_tool_call_parser`; ``validate`` refuses a format no parser is registered for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ParsedTurn",
    "ToolCall",
    "argument_problem",
    "hermes_parser",
    "register_tool_call_parser",
    "schema_problem",
    "tool_call_parser",
    "tool_call_parsers",
]


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: ``name`` and ``arguments``, or ``error`` when it cannot be read."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    """Why the call cannot run (malformed JSON, no name, arguments not an object); None for a readable call."""

    def as_message(self) -> dict[str, Any]:
        """The OpenAI-style ``tool_calls`` entry of the assistant message."""
        return {"type": "function", "function": {"name": self.name, "arguments": dict(self.arguments)}}


@dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn's text split into its content and its calls."""

    content: str
    calls: list[ToolCall]


Parser = Callable[[str], ParsedTurn]
_PARSERS: dict[str, Parser] = {}


def register_tool_call_parser(name: str) -> Callable[[Parser], Parser]:
    """Decorator: make ``parser(text) -> ParsedTurn`` available as ``rollout.multi_turn.format: <name>``."""

    def decorate(parser: Parser) -> Parser:
        _PARSERS[str(name)] = parser
        return parser

    return decorate


def tool_call_parsers() -> list[str]:
    """The registered format names."""
    return sorted(_PARSERS)


def tool_call_parser(name: str) -> Parser:
    """The parser registered as ``name``; KeyError naming the registered ones otherwise."""
    try:
        return _PARSERS[str(name)]
    except KeyError:
        raise KeyError(
            f"rollout.multi_turn.format: no tool-call parser {name!r} (registered: {', '.join(tool_call_parsers())})"
        ) from None


_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HERMES_OPEN = "<tool_call>"


@register_tool_call_parser("hermes")
def hermes_parser(text: str) -> ParsedTurn:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks; an opened block never closed is a
    malformed call (the turn ran out of tokens, or the model forgot the closing tag)."""
    calls = [_hermes_call(body) for body in _HERMES.findall(text)]
    content = _HERMES.sub("", text)
    if _HERMES_OPEN in content:  # an unclosed block after the last closed one
        head, _, tail = content.partition(_HERMES_OPEN)
        calls.append(ToolCall(name="", error=f"a {_HERMES_OPEN} block is not closed by </tool_call>: {tail.strip()[:80]!r}"))
        content = head
    return ParsedTurn(content=content.strip(), calls=calls)


def _hermes_call(body: str) -> ToolCall:
    try:
        value = json.loads(body.strip())
    except json.JSONDecodeError as problem:
        return ToolCall(name="", error=f"the tool call is not valid JSON ({problem.msg} at character {problem.pos})")
    if not isinstance(value, Mapping):
        return ToolCall(name="", error=f'the tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, got {type(value).__name__}')
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(name="", error='the tool call has no "name" string')
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, Mapping):
        return ToolCall(name=name, error=f'the "arguments" of {name!r} must be a JSON object, got {type(arguments).__name__}')
    return ToolCall(name=name, arguments=dict(arguments))


# ---------------------------------------------------------------------------------- the JSON-schema checks
def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why a tool's OpenAI function ``schema`` is unusable (no function name, parameters not a valid JSON
    schema), or None."""
    from jsonschema import Draft202012Validator  # jsonschema: only when a tool's schema is checked, off the CLI's fast path
    from jsonschema.exceptions import SchemaError  # as above

    function = schema.get("function") if isinstance(schema, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function.get("name"):
        return 'the schema must be {"type": "function", "function": {"name": ..., "parameters": {...}}}'
    parameters = function.get("parameters", {"type": "object"})
    if not isinstance(parameters, Mapping):
        return f"function.parameters must be a JSON schema object, got {type(parameters).__name__}"
    try:
        Draft202012Validator.check_schema(dict(parameters))
    except SchemaError as problem:
        return f"function.parameters is not a valid JSON schema: {problem.message}"
    return None


def argument_problem(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` fail the ``parameters`` of a tool's function schema (the first error, with its path),
    or None."""
    from jsonschema import Draft202012Validator  # jsonschema: only when a tool call's arguments are checked

    parameters = dict((schema.get("function") or {}).get("parameters") or {"type": "object"})
    errors = sorted(Draft202012Validator(parameters).iter_errors(dict(arguments)), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(part) for part in first.absolute_path)
    return f"{first.message}" + (f" (at {where})" if where else "")


def tool_call_text(call: ToolCall) -> str:
    """A call written back in hermes form (for tests and examples)."""
    return "<tool_call>" + json.dumps({"name": call.name, "arguments": dict(call.arguments)}) + "</tool_call>"
