"""SFT on multi-turn tool chats with a real tiny model: the loss is the mean over the assistant tokens only,
in the worker and through the whole sft stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from rlhfctl.data.pairs import DemonstrationDataset, collate_demonstrations
from rlhfctl.models.loading import load_causal_lm
from rlhfctl.models.tokenizer import CharTokenizer
from rlhfctl.protocol import DataProto
from rlhfctl.recipe import load_recipe, validate_recipe
from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup
from rlhfctl.trainer import run_training
from tests.data.test_chat_masks import TOOL_TEMPLATE, learned_spans
from tests.workers.recipes import tiny_recipe
from workers.sft import SFTWorker

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def tool_chat(a: int, b: int) -> dict:
    call = {"type": "function", "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})}}
    return {"messages": [
        {"role": "user", "content": f"{a}+{b}?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "add", "content": str(a + b)},
        {"role": "assistant", "content": f"It is {a + b}."},
    ]}


CHATS = [tool_chat(a, b) for a, b in ((2, 3), (10, 7), (4, 40), (1, 1))]


def hand_masked_mean(model: torch.nn.Module, rows) -> float:
    """The next-token NLL averaged over the assistant tokens, one demonstration at a time, no padding."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row.input_ids])
            nll = F.cross_entropy(model(input_ids=ids).logits[0, :-1].float(), ids[0, 1:], reduction="none")
            learned = torch.tensor(row.loss_mask[1:], dtype=torch.bool)
            total += float(nll[learned].sum())
            count += int(learned.sum())
    return total / count


def test_two_sft_steps_on_tool_chats_take_the_loss_on_assistant_tokens_only(tmp_path):
    tokenizer = CharTokenizer(chat_template=TOOL_TEMPLATE)
    rows = list(DemonstrationDataset(CHATS, tokenizer))
    assert learned_spans(tokenizer, rows[0].input_ids, rows[0].loss_mask) == [
        '<call>add({"a": 2, "b": 3})</call><eos>', "It is 5.<eos>"]
    batch = collate_demonstrations(rows, tokenizer.pad_token_id)
    actor = LocalWorkerGroup(1, ClassWithInitArgs(SFTWorker, tiny_recipe(), "actor"), role="actor")
    actor.init_model()
    try:
        actor.export_hf(str(tmp_path / "before"))
        expected = hand_masked_mean(load_causal_lm({"path": str(tmp_path / "before")}, tokenizer), rows)
        first = actor.train_sft(DataProto.from_dict(batch, meta_info={"packed": False}))[0]
        second = actor.train_sft(DataProto.from_dict(batch, meta_info={"packed": False}))[0]
        scored = actor.eval_sft(DataProto.from_dict(batch, meta_info={"packed": False}))
    finally:
        actor.shutdown()
    # The first step's loss is taken before its update: exactly the hand-computed masked mean.
    assert first["loss"] == pytest.approx(expected, rel=1e-4)
    assert first["tokens"] == sum(sum(row.loss_mask) for row in rows) == scored.batch["tokens"].sum().item()
    assert second["loss"] < first["loss"] and scored.batch["nll_sum"].sum().item() / first["tokens"] < second["loss"]


def test_the_sft_stage_trains_on_tool_chats_from_a_file(tmp_path):
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps(chat) + "\n" for chat in CHATS))
    CharTokenizer(chat_template=TOOL_TEMPLATE).save_pretrained(tmp_path / "tokenizer")
    recipe = yaml.safe_load((RECIPES / "sft-quickstart.yaml").read_text())
    recipe["roles"]["actor"]["model"]["tokenizer_path"] = str(tmp_path / "tokenizer")
    recipe["data"] = {"train_files": [str(chats)], "max_length": 128, "packing": True}
    recipe["trainer"].update(total_steps=2, batch_size=len(CHATS), val_every=0, output_dir=str(tmp_path / "sft"))
    recipe["ray"] = {"backend": "local"}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    cfg = load_recipe(tmp_path / "recipe.yaml", [])
    report = validate_recipe(cfg)
    assert report.ok, [issue.message for issue in report.errors]
    run_training(cfg)
    records = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    tokenizer = CharTokenizer(chat_template=TOOL_TEMPLATE)
    learned = sum(sum(row.loss_mask) for row in DemonstrationDataset(CHATS, tokenizer))
    assert [record["step"] for record in records] == [1, 2]
    assert all(record["tokens/response"] == learned for record in records)  # every batch holds all four chats
    assert records[1]["loss"] < records[0]["loss"]
