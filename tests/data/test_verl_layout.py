"""verl-format prompt data trains unchanged: chat-message prompts get the chat template, ground_truth is lifted
from reward_model.ground_truth, and the other columns reach the reward function as they are."""

from __future__ import annotations

import csv
import json
import pickle

import numpy as np
import pytest

from rlhfctl.data import DataConfigError, DataFileError, PromptDataset
from rlhfctl.data.records import count_records
from rlhfctl.data.verl_layout import (
    ground_truth_key,
    reward_columns,
    uses_chat_template,
)
from rlhfctl.models.tokenizer import CharTokenizer
from rlhfctl.protocol import DataProto
from rlhfctl.recipe.load import recipe_from_dict
from rlhfctl.trainer.prompt_source import build_dataset, to_dataproto
from tests.data.verl_rows import gsm8k_rows, write_jsonl, write_parquet
from tests.recipe.builders import recipe_data

TEMPLATE = (
    "{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
"""A chat template unlike CharTokenizer's default, so a test sees which one rendered the prompt."""

MESSAGES = [{"role": "system", "content": "terse"}, {"role": "user", "content": "yo"}]


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return CharTokenizer(chat_template=TEMPLATE)


# --------------------------------------------------------------------------- the chat-template rule
@pytest.mark.parametrize("setting, prompt, chat", [
    (None, "hi", False), (None, MESSAGES, True),
    (True, "hi", True), (True, MESSAGES, True),
    (False, "hi", False), (False, MESSAGES, False),
])
def test_uses_chat_template_follows_null_true_false(setting, prompt, chat) -> None:
    assert uses_chat_template(setting, prompt) is chat


def test_null_renders_messages_with_the_template_and_text_as_it_is(tokenizer) -> None:
    dataset = PromptDataset([{"prompt": "hi"}, {"prompt": MESSAGES}], tokenizer=tokenizer, apply_chat_template=None)
    assert dataset[0].prompt_text == "hi" and dataset[0].messages is None
    assert dataset[1].prompt_text == "<system>terse\n<user>yo\n<assistant>"
    assert dataset[1].messages == tuple(MESSAGES)


def test_true_renders_a_text_prompt_as_one_user_message(tokenizer) -> None:
    dataset = PromptDataset([{"prompt": "hi"}, {"prompt": MESSAGES}], tokenizer=tokenizer, apply_chat_template=True)
    assert [row.prompt_text for row in dataset] == ["<user>hi\n<assistant>", "<system>terse\n<user>yo\n<assistant>"]


def test_false_rejects_a_list_prompt_naming_the_record_and_the_key(tokenizer) -> None:
    with pytest.raises(DataFileError, match=r"f\.jsonl: record 2: the prompt is a list of messages; set "
                                            r"apply_chat_template to null or true \(data\.apply_chat_template\)"):
        PromptDataset([{"prompt": "hi"}, {"prompt": MESSAGES}], tokenizer=tokenizer, apply_chat_template=False,
                      source="f.jsonl")


def test_a_message_prompt_without_a_tokenizer_chat_template_names_the_source_record_and_what_to_set() -> None:
    bare = CharTokenizer()
    bare.chat_template = None
    with pytest.raises(DataFileError, match=r"train\.parquet: record 2: the prompt is a list of \{role, content\} "
                                            r"messages, .* the tokenizer has none; .*tokenizer_path"):
        PromptDataset([{"prompt": "hi"}, {"prompt": MESSAGES}], tokenizer=bare, apply_chat_template=None,
                      source="train.parquet")
    with pytest.raises(DataConfigError, match="tokenizer has no chat template"):
        PromptDataset([{"prompt": "hi"}], tokenizer=bare, apply_chat_template=True)


# --------------------------------------------------------------------------- the ground-truth lift
def test_ground_truth_is_lifted_from_reward_model_and_the_rest_is_left_as_it_is() -> None:
    row = gsm8k_rows(1)[0]
    columns = reward_columns(row, "prompt")
    assert ground_truth_key(row) == "reward_model.ground_truth"
    assert columns == {**{key: value for key, value in row.items() if key != "prompt"}, "ground_truth": "2"}
    assert columns["reward_model"] is row["reward_model"] and columns["extra_info"] is row["extra_info"]


@pytest.mark.parametrize("record, key, value", [
    ({"prompt": "p", "ground_truth": "1", "reward_model": {"ground_truth": "2"}}, "ground_truth", "1"),
    ({"prompt": "p", "ground_truth": None, "reward_model": {"ground_truth": "2"}}, "reward_model.ground_truth", "2"),
    ({"prompt": "p", "reward_model": {"ground_truth": None}}, "reward_model.ground_truth", None),
    ({"prompt": "p", "reward_model": {"style": "model"}}, None, None),
    ({"prompt": "p", "reward_model": "not a dict"}, None, None),
    ({"prompt": "p"}, None, None),
])
def test_a_top_level_ground_truth_wins_and_a_missing_one_is_not_invented(record, key, value) -> None:
    assert ground_truth_key(record) == key
    assert reward_columns(record, "prompt").get("ground_truth") == value
    assert ("ground_truth" in reward_columns(record, "prompt")) is (key is not None or "ground_truth" in record)


# --------------------------------------------------------------------------- a verl file through build_dataset
def _cfg(path, **data):
    return recipe_from_dict(recipe_data(data={"train_files": [str(path)], "max_prompt_length": 256, **data}))


@pytest.mark.parametrize("write", [write_parquet, write_jsonl], ids=["parquet", "jsonl"])
def test_a_verl_gsm8k_file_loads_through_build_dataset(tmp_path, tokenizer, write) -> None:
    rows = gsm8k_rows(4)
    path = write(tmp_path / f"train.{'parquet' if write is write_parquet else 'jsonl'}", rows)
    dataset = build_dataset(_cfg(path), tokenizer, "train")
    assert len(dataset) == 4
    for row, source in zip(dataset, rows):
        content = source["prompt"][0]["content"]
        assert row.prompt_text == f"<user>{content}\n<assistant>"
        assert row.prompt_ids == tuple(tokenizer(row.prompt_text, add_special_tokens=False)["input_ids"])
        assert row.messages == tuple(source["prompt"])
        assert row.columns == {**{k: v for k, v in source.items() if k != "prompt"},
                               "ground_truth": source["reward_model"]["ground_truth"]}
    assert isinstance(dataset[0].columns["extra_info"], dict) and dataset[0].columns["extra_info"]["index"] == 0


def test_apply_chat_template_false_stops_a_verl_file_at_its_first_record(tmp_path, tokenizer) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", gsm8k_rows(2))
    with pytest.raises(DataFileError, match=r"train\.jsonl: record 1: the prompt is a list of messages"):
        build_dataset(_cfg(path, apply_chat_template=False), tokenizer, "train")


# --------------------------------------------------------------------------- the columns through DataProto
def _batch(tokenizer, rows):
    dataset = PromptDataset(rows, tokenizer=tokenizer, apply_chat_template=None)
    return to_dataproto(list(dataset), tokenizer)


def _assert_rows(batch: DataProto, rows) -> None:
    """Each column is one value per sample: a dict stays a dict, a list stays a list (no 2-D array)."""
    for name in ("ground_truth", "reward_model", "extra_info", "data_source", "ability"):
        column = batch.non_tensor_batch[name]
        assert column.ndim == 1 and len(column) == len(rows), name
        assert [reward_columns(row, "prompt")[name] for row in rows] == column.tolist(), name
    for value in batch.non_tensor_batch["extra_info"]:
        assert isinstance(value, dict)


def test_dict_and_list_columns_survive_dataproto_per_sample(tokenizer) -> None:
    rows = gsm8k_rows(4)
    for row, answers in zip(rows, (["2", "two"], ["4", "four"], ["6", "six"], ["8", "eight"])):
        row["reward_model"] = {"style": "rule", "ground_truth": answers}  # a list answer of equal length in every row
    batch = _batch(tokenizer, rows)
    assert batch.non_tensor_batch["ground_truth"].dtype == object
    assert batch.non_tensor_batch["ground_truth"][1] == ["4", "four"]
    _assert_rows(batch, rows)
    _assert_rows(pickle.loads(pickle.dumps(batch)), rows)  # across Ray
    _assert_rows(batch[1], rows[1:2])
    _assert_rows(batch[[3, 0]], [rows[3], rows[0]])
    _assert_rows(batch[np.array([True, False, True, False])], rows[::2])
    pieces = batch.chunk(2)
    _assert_rows(pieces[0], rows[:2])
    _assert_rows(DataProto.concat(pieces[::-1]), rows[2:] + rows[:2])
    _assert_rows(DataProto.concat(batch.split(3)), rows)
    _assert_rows(batch.repeat(3, interleave=True), [row for row in rows for _ in range(3)])  # as the rollout does
    _assert_rows(batch.repeat(2, interleave=False), rows + rows)


def test_two_batches_with_differently_shaped_columns_concatenate(tokenizer) -> None:
    first, second = gsm8k_rows(2), gsm8k_rows(2)
    second[0]["reward_model"] = {"style": "rule", "ground_truth": ["1", "2", "3"]}
    joined = DataProto.concat([_batch(tokenizer, first), _batch(tokenizer, second)])
    _assert_rows(joined, first + second)


# --------------------------------------------------------------------------- counting rows cheaply
def test_count_records_reads_metadata_and_lines(tmp_path) -> None:
    rows = gsm8k_rows(5)
    assert count_records(write_parquet(tmp_path / "a.parquet", rows)) == 5
    lines = write_jsonl(tmp_path / "a.jsonl", rows)
    lines.write_text(lines.read_text() + "\n\n", encoding="utf-8")
    assert count_records(lines) == 5
    (tmp_path / "a.json").write_text(json.dumps([{"prompt": "x"}] * 3), encoding="utf-8")
    assert count_records(tmp_path / "a.json") == 3
    with open(tmp_path / "a.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerows([["prompt", "ground_truth"], ["a\nb", "1"], ["c", "2"]])
    assert count_records(tmp_path / "a.csv") == 2
    assert count_records(tmp_path / "missing.parquet") is None


# --------------------------------------------------------------------------- the stages' data under null
def test_stage_data_reads_a_null_apply_chat_template(tokenizer) -> None:
    from rlhfctl.data.pairs import DemonstrationDataset, PreferenceDataset

    data = recipe_from_dict(recipe_data()).data
    assert data.apply_chat_template is None
    pair = PreferenceDataset.from_data_section([{"prompt": "q", "chosen": "a", "rejected": "b"}], tokenizer, data, "p")
    assert pair[0].prompt_ids == tuple(tokenizer("q", add_special_tokens=False)["input_ids"])  # text as it is
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    demo = DemonstrationDataset.from_data_section([{"messages": chat}], tokenizer, data, "d")
    assert demo[0].prompt_ids == tuple(tokenizer("<user>q\n<assistant>", add_special_tokens=False)["input_ids"])
