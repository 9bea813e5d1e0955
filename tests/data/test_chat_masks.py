"""Chat demonstrations learn every assistant turn: tool calls included, system/user/tool turns and role headers masked,
single-turn data exactly as before (the fixture of today's output), truncation and packing carry the mask."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfctl.data.chat_masks import turn_end
from rlhfctl.data.errors import DataFileError
from rlhfctl.data.pairs import DemonstrationDataset, collate_demonstrations
from rlhfctl.models.tokenizer import CharTokenizer

FIXTURE = Path(__file__).with_name("fixtures") / "sft_single_turn.json"

TOOL_TEMPLATE = (
    "{% if tools %}[system]\n{% for tool in tools %}{{ tool['function']['name'] }};{% endfor %}<eos>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}[tool {{ message['name'] }}]\n{{ message['content'] }}<eos>\n"
    "{% else %}[{{ message['role'] }}]\n{{ message['content'] or '' }}"
    "{% for call in message['tool_calls'] or [] %}"
    "<call>{{ call['function']['name'] }}({{ call['function']['arguments'] }})</call>"
    "{% endfor %}<eos>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}[assistant]\n{% endif %}"
)
"""A hermes-like template for the character tokenizer: every turn ends with ``<eos>`` and a newline, as Qwen's."""

CALL = {"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
TOOL_CHAT = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "5"},
    {"role": "assistant", "content": "It is 5."},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "content": "Welcome"},
]
LEARNED = ['<call>add({"a": 2, "b": 3})</call><eos>', "It is 5.<eos>", "Welcome<eos>"]
"""The assistant turns' labels in TOOL_CHAT, in order: each turn's own rendering after its header, through <eos>."""


def tool_tokenizer() -> CharTokenizer:
    return CharTokenizer(chat_template=TOOL_TEMPLATE)


def text_of(tokenizer: CharTokenizer, ids) -> str:
    return "".join("<eos>" if token == tokenizer.eos_token_id else tokenizer.convert_ids_to_tokens(token) for token in ids)


def learned_spans(tokenizer: CharTokenizer, ids, mask) -> list[str]:
    """The texts of the runs of mask-1 tokens."""
    spans, current = [], []
    for token, learned in zip(ids, mask):
        if learned:
            current.append(token)
        elif current:
            spans.append(text_of(tokenizer, current))
            current = []
    return spans + ([text_of(tokenizer, current)] if current else [])


def test_a_tool_chat_learns_exactly_the_assistant_tokens_token_by_token():
    tokenizer = tool_tokenizer()
    row = DemonstrationDataset([{"messages": TOOL_CHAT}], tokenizer, max_length=256)[0]
    rendered = tokenizer.apply_chat_template(TOOL_CHAT, tokenize=False)
    # The sequence is the template's rendering, less the newline after the last turn's <eos>.
    assert rendered.endswith("Welcome<eos>\n") and text_of(tokenizer, row.input_ids) == rendered[:-1]
    assert text_of(tokenizer, row.prompt_ids) == "[system]\nUse tools.<eos>\n[user]\n2+3?<eos>\n[assistant]\n"
    assert learned_spans(tokenizer, row.input_ids, row.loss_mask) == LEARNED
    # Token by token over the rendered text: 1 exactly on the pieces inside an assistant turn's body.
    pieces = [text_of(tokenizer, [token]) for token in tokenizer(rendered, add_special_tokens=False)["input_ids"]]
    offsets = [sum(len(piece) for piece in pieces[:position]) for position in range(len(pieces))]
    inside, position = set(), 0
    for span in LEARNED:
        start = rendered.index(span, position)
        inside.update(range(start, start + len(span)))
        position = start + len(span)
    assert list(row.loss_mask) == [int(offset in inside) for offset in offsets][: len(row)] and len(pieces) == len(row) + 1
    for context in ("[system]", "Use tools.", "[user]", "2+3?", "[tool add]", "Thanks", "[assistant]"):
        start = rendered.index(context)
        covered = [position for position, offset in enumerate(offsets) if start <= offset < start + len(context)]
        assert {row.loss_mask[position] for position in covered} == {0}, context


def test_a_template_without_eos_turn_ends_gets_eos_after_each_assistant_turn():
    tokenizer = CharTokenizer()  # role: content\n
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "tool", "content": "c"},
            {"role": "assistant", "content": "d"}]
    row = DemonstrationDataset([{"messages": chat}], tokenizer)[0]
    assert turn_end(tokenizer) == "\n"
    assert text_of(tokenizer, row.input_ids) == "user: a\nassistant: b<eos>\ntool: c\nassistant: d<eos>"
    assert learned_spans(tokenizer, row.input_ids, row.loss_mask) == ["b<eos>", "d<eos>"]


def test_the_tools_column_reaches_the_template():
    tokenizer = tool_tokenizer()
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    row = DemonstrationDataset([{"messages": TOOL_CHAT[1:], "tools": tools}], tokenizer, max_length=256)[0]
    assert text_of(tokenizer, row.prompt_ids).startswith("[system]\nadd;<eos>\n[user]\n2+3?")
    assert learned_spans(tokenizer, row.input_ids, row.loss_mask) == LEARNED


def test_single_turn_demonstrations_give_todays_tokens_and_masks():
    reference = json.loads(FIXTURE.read_text(encoding="utf-8"))
    for case in reference["cases"]:
        tokenizer = CharTokenizer(chat_template=reference["templates"][case["template"]])
        rows = list(DemonstrationDataset(case["records"], tokenizer, **case["reading"]))
        got = [{"index": row.index, "prompt_ids": list(row.prompt_ids), "response_ids": list(row.response_ids)}
               for row in rows]
        assert got == case["rows"], case["name"]
        assert all(row.response_mask == (1,) * len(row.response_ids) for row in rows), case["name"]
        packing = {"plain": {}, "packed": {"packing": True, "max_length": case["reading"].get("max_length", 128)}}
        for kind, options in packing.items():
            batch = collate_demonstrations(rows, tokenizer.pad_token_id, **options)
            assert {key: value.tolist() for key, value in batch.items()} == case["batches"][kind], (case["name"], kind)


def test_packing_carries_each_chats_mask():
    tokenizer = tool_tokenizer()
    rows = list(DemonstrationDataset([{"messages": TOOL_CHAT}, {"messages": TOOL_CHAT[:5]}, {"prompt": "q", "response": "a"}],
                                     tokenizer, max_length=512))
    batch = collate_demonstrations(rows, tokenizer.pad_token_id, packing=True, max_length=512)
    assert batch["input_ids"].shape[0] == 1
    line, start = batch["loss_mask"][0].tolist(), 0
    for row in rows:
        assert line[start : start + len(row)] == list(row.loss_mask)
        assert batch["position_ids"][0, start : start + len(row)].tolist() == list(range(len(row)))
        start += len(row)
    assert learned_spans(tokenizer, batch["input_ids"][0].tolist(), line) == [*LEARNED, *LEARNED[:2], "a<eos>"]


@pytest.mark.parametrize("cut_after, learned", [
    ("It", ['<call>add({"a": 2, "b": 3})</call><eos>', "It"]),  # inside the second assistant turn: no <eos> learned
    ("[tool add]\n5", ['<call>add({"a": 2, "b": 3})</call><eos>']),  # inside the tool turn: its kept part is dropped
])
def test_truncated_chats_keep_their_first_turns(cut_after, learned):
    tokenizer = tool_tokenizer()
    whole = DemonstrationDataset([{"messages": TOOL_CHAT}], tokenizer, max_length=256)[0]
    keep = next(count for count in range(len(whole)) if text_of(tokenizer, whole.input_ids[:count]).endswith(cut_after))
    cut = DemonstrationDataset([{"messages": TOOL_CHAT}], tokenizer, max_length=keep, overlong="truncate")
    row = cut[0]
    assert cut.truncated == 1 and row.prompt_ids == whole.prompt_ids  # the prompt fits in half of max_length
    assert row.input_ids == whole.input_ids[: len(row)] and row.loss_mask[-1] == 1
    assert learned_spans(tokenizer, row.input_ids, row.loss_mask) == learned
    with pytest.raises(DataFileError, match=r"record 1: the chat is 153 tokens, over data.max_length"):
        DemonstrationDataset([{"messages": TOOL_CHAT}], tokenizer, max_length=keep)


@pytest.mark.parametrize("messages, words", [
    ([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "tool", "content": "t"}],
     "the chat has no assistant message (roles: system, user, tool), so nothing to learn"),
    ([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "t"}],
     "the last message must be the assistant's, got role 'tool'"),
    ([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}], "opens with an assistant message"),
    ([{"role": "user", "content": "u"}, {"role": "assistant", "content": ""}], "neither text content nor tool_calls"),
    ([{"role": "user"}, {"role": "assistant", "content": "a"}], "message 1 must be a mapping with 'role' and 'content'"),
])
def test_bad_chats_are_refused_naming_the_record(messages, words):
    with pytest.raises(DataFileError) as caught:
        DemonstrationDataset([{"messages": messages}], tool_tokenizer(), source="chats.jsonl")
    assert str(caught.value).startswith("chats.jsonl: record 1: ") and words in str(caught.value)


def test_a_template_that_rewrites_earlier_turns_is_refused():
    # Like templates that drop past reasoning: only the last assistant message is rendered in full.
    template = (
        "{% for message in messages %}{{ message['role'] }}: "
        "{% if message['role'] == 'assistant' and not loop.last %}(earlier){% else %}{{ message['content'] }}{% endif %}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
            {"role": "assistant", "content": "d"}]
    with pytest.raises(DataFileError, match="record 1: the chat template does not render prefixes stably: messages 1-2"):
        DemonstrationDataset([{"messages": chat}], CharTokenizer(chat_template=template))
    assert len(DemonstrationDataset([{"messages": chat[:2]}], CharTokenizer(chat_template=template))) == 1


def test_a_template_that_ends_some_assistant_turns_differently_is_refused():
    # Like Llama 3.1's <|eom_id|> after tool calls: the turn end measured on a plain reply does not match.
    template = TOOL_TEMPLATE.replace("{% endfor %}<eos>", "{% endfor %}{% if message['tool_calls'] %}<eom>{% else %}<eos>{% endif %}")
    with pytest.raises(DataFileError, match=r"record 1: the chat template ends assistant message 3 with '\)</call><eom>', not with its turn end"):
        DemonstrationDataset([{"messages": TOOL_CHAT}], CharTokenizer(chat_template=template), max_length=256)


def test_a_tools_column_must_be_a_list():
    with pytest.raises(DataFileError, match="record 1: the 'tools' column must be a list of function schemas, got str"):
        DemonstrationDataset([{"messages": TOOL_CHAT, "tools": "add"}], tool_tokenizer(), max_length=256)


@pytest.mark.parametrize("template", [TOOL_TEMPLATE, None])
def test_the_context_between_assistant_turns_is_what_an_agent_rollout_appends(template):
    from rlhfctl.agents.chat_turns import ChatTurns

    tokenizer = CharTokenizer(chat_template=template)
    row = DemonstrationDataset([{"messages": TOOL_CHAT}], tokenizer, max_length=256)[0]
    mask, response = row.response_mask, row.response_ids
    first_end = mask.index(0)  # the first assistant turn ends with <eos>, as the engine's generation does
    second_start = mask.index(1, first_end)
    assert response[first_end - 1] == tokenizer.eos_token_id
    rollout = ChatTurns(tokenizer, [tokenizer.eos_token_id]).token_ids([TOOL_CHAT[3]], tokenizer.eos_token_id)
    assert list(response[first_end:second_start]) == rollout
