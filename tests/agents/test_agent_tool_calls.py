"""The hermes tool-call parser, the parser registry and the JSON-schema checks of a tool's arguments."""

from __future__ import annotations

import pytest

from rlhfctl.agents import register_tool_call_parser
from rlhfctl.agents.tool_calls import (
    ParsedTurn,
    argument_problem,
    hermes_parser,
    schema_problem,
    tool_call_parser,
    tool_call_parsers,
)

SCHEMA = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}


def test_hermes_reads_every_call_and_keeps_the_text_around_them():
    text = 'Let me add. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> and '\
           '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}</tool_call>'
    parsed = hermes_parser(text)
    assert [(call.name, dict(call.arguments), call.error) for call in parsed.calls] == [
        ("add", {"a": 1, "b": 2}, None), ("add", {"a": 3, "b": 4}, None)]
    assert parsed.content == "Let me add.  and"


def test_a_turn_without_calls_is_all_content():
    assert hermes_parser("The answer is 4.") == ParsedTurn("The answer is 4.", [])


@pytest.mark.parametrize("body, words", [
    ('{"name": "add", "arguments": {"a": 1,}}', "not valid JSON"),
    ('["add"]', "JSON object"),
    ('{"arguments": {}}', 'no "name"'),
    ('{"name": "add", "arguments": [1, 2]}', '"arguments" of \'add\' must be a JSON object'),
])
def test_a_malformed_call_is_a_call_with_an_error(body, words):
    (call,) = hermes_parser(f"<tool_call>{body}</tool_call>").calls
    assert call.error is not None and words in call.error


def test_an_unclosed_block_is_a_malformed_call():
    parsed = hermes_parser('ok <tool_call>{"name": "add"')
    assert parsed.content == "ok"
    assert len(parsed.calls) == 1 and "not closed" in parsed.calls[0].error


def test_a_registered_parser_is_found_by_its_format_name():
    @register_tool_call_parser("test-upper")
    def upper(text: str) -> ParsedTurn:
        return ParsedTurn(text.upper(), [])

    assert "test-upper" in tool_call_parsers() and "hermes" in tool_call_parsers()
    assert tool_call_parser("test-upper")("a").content == "A"
    with pytest.raises(KeyError, match="no tool-call parser 'nope'"):
        tool_call_parser("nope")


def test_arguments_are_checked_against_the_tools_json_schema():
    assert argument_problem(SCHEMA, {"a": 1, "b": 2}) is None
    assert "'b' is a required property" in argument_problem(SCHEMA, {"a": 1})
    assert "is not of type 'integer'" in argument_problem(SCHEMA, {"a": "x", "b": 2})
    assert "(at a)" in argument_problem(SCHEMA, {"a": "x", "b": 2})


def test_an_unusable_schema_is_named():
    assert schema_problem(SCHEMA) is None
    assert "function" in schema_problem({"type": "function"})
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}
    assert "not a valid JSON schema" in schema_problem(bad)
