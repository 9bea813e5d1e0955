"""Agent rollouts' tool schemas reach the prompt through the chat template's ``tools``."""

from __future__ import annotations

from rlhfctl.agents.tool_registry import chat_tools
from rlhfctl.agents.tools import Calculator
from rlhfctl.data import PromptDataset
from rlhfctl.models.tokenizer import CharTokenizer

TEMPLATE = ("{% if tools %}tools:{% for tool in tools %} {{ tool.function.name }}{% endfor %}\n{% endif %}"
            "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:")
RECORD = {"prompt": [{"role": "user", "content": "2*3?"}]}


def test_the_chat_template_is_shown_the_tools_schemas():
    tokenizer = CharTokenizer(chat_template=TEMPLATE)
    with_tools = PromptDataset([RECORD], tokenizer=tokenizer, apply_chat_template=None, chat_tools=[Calculator.schema])
    plain = PromptDataset([RECORD], tokenizer=tokenizer, apply_chat_template=None)
    assert with_tools[0].prompt_text.startswith("tools: calculator")
    assert with_tools[0].prompt_text.endswith("user: 2*3?\nassistant:")
    assert plain[0].prompt_text == "user: 2*3?\nassistant:"


def test_the_schemas_come_from_the_recipes_tools_only_with_multi_turn_on():
    tools = [{"class": "rlhfctl.agents.tools:Calculator", "config": {}}]
    assert chat_tools({"enable": True, "tools": tools}) == [dict(Calculator.schema)]
    assert chat_tools({"enable": False, "tools": tools}) is None
    assert chat_tools({"enable": True, "tools": []}) is None
