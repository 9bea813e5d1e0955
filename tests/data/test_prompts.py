"""Prompt files, datasets, batching and collation."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from rlhfctl.data.prompts import (
    DataConfigError,
    DataFileError,
    PromptBatcher,
    PromptDataset,
    collate_prompts,
    load_records,
)
from rlhfctl.models.tokenizer import CharTokenizer

RECORDS = [
    {"prompt": "digits 1 2 3:", "ground_truth": "123", "source": "a"},
    {"prompt": "digits 4 5:", "ground_truth": "45", "source": "b"},
    {"prompt": "digits 6 7 8 9:", "ground_truth": "6789", "source": "c"},
]


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


def _jsonl(path, lines) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


# --------------------------------------------------------------------------- load_records


def test_load_jsonl_skips_blank_lines(tmp_path) -> None:
    path = _jsonl(tmp_path / "p.jsonl", [json.dumps(r) for r in RECORDS[:2]] + ["", json.dumps(RECORDS[2])])
    assert load_records(path) == RECORDS


def test_load_json_lines_and_json_array(tmp_path) -> None:
    lines = _jsonl(tmp_path / "lines.json", [json.dumps(r) for r in RECORDS])
    array = tmp_path / "array.json"
    array.write_text(json.dumps(RECORDS, indent=2), encoding="utf-8")
    assert load_records(lines) == load_records(array) == RECORDS


def test_load_csv(tmp_path) -> None:
    path = tmp_path / "p.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["prompt", "ground_truth", "source"])
        writer.writeheader()
        writer.writerows(RECORDS)
    assert load_records(path) == RECORDS


def test_load_parquet(tmp_path) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    records = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in RECORDS]
    path = tmp_path / "p.parquet"
    parquet.write_table(pyarrow.Table.from_pylist(records), path)
    assert load_records(path) == records


def test_a_limit_reads_only_the_first_records_of_every_format(tmp_path) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    many = [{"prompt": f"q{i}", "ground_truth": str(i)} for i in range(10)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in many) + "{broken\n")
    (tmp_path / "p.json").write_text(json.dumps(many))
    with open(tmp_path / "p.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["prompt", "ground_truth"])
        writer.writeheader()
        writer.writerows(many)
    parquet.write_table(pyarrow.Table.from_pylist(many), tmp_path / "p.parquet")
    for name in ("p.jsonl", "p.json", "p.csv", "p.parquet"):
        assert load_records(tmp_path / name, limit=3) == many[:3], name
    with pytest.raises(DataFileError, match="line 11: malformed JSON"):
        load_records(tmp_path / "p.jsonl")


def test_missing_file(tmp_path) -> None:
    with pytest.raises(DataFileError, match=r"nope\.jsonl: no such file"):
        load_records(tmp_path / "nope.jsonl")


def test_empty_file(tmp_path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(DataFileError, match=r"empty\.jsonl: the file is empty"):
        load_records(tmp_path / "empty.jsonl")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(DataFileError, match=r"blank\.jsonl: the file holds no records"):
        load_records(tmp_path / "blank.jsonl")


def test_malformed_json_names_line(tmp_path) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [json.dumps(RECORDS[0]), "", '{"prompt": "x",}'])
    with pytest.raises(DataFileError, match=r"bad\.jsonl: line 3: malformed JSON"):
        load_records(path)


def test_non_object_line_names_line(tmp_path) -> None:
    path = _jsonl(tmp_path / "list.jsonl", [json.dumps(RECORDS[0]), '["prompt"]'])
    with pytest.raises(DataFileError, match=r"list\.jsonl: line 2: expected a JSON object.*list"):
        load_records(path)


def test_undecodable_bytes_name_line(tmp_path) -> None:
    path = tmp_path / "latin.jsonl"
    path.write_bytes(json.dumps(RECORDS[0]).encode() + b'\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(DataFileError, match=r"latin\.jsonl: line 2: not valid UTF-8"):
        load_records(path)


def test_unsupported_extension_lists_supported(tmp_path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("hello")
    with pytest.raises(DataFileError, match=r"prompts\.txt: unsupported file type '\.txt'.*\.jsonl.*\.parquet.*\.csv"):
        load_records(path)


def test_bad_parquet(tmp_path) -> None:
    pytest.importorskip("pyarrow")
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataFileError, match=r"broken\.parquet: not a readable parquet file"):
        load_records(path)


# --------------------------------------------------------------------------- PromptDataset


def test_dataset_tokenizes_and_keeps_columns(tokenizer) -> None:
    dataset = PromptDataset(RECORDS, tokenizer=tokenizer, max_prompt_length=32)
    assert len(dataset) == 3
    row = dataset[1]
    assert row.prompt_text == "digits 4 5:"
    assert list(row.prompt_ids) == tokenizer("digits 4 5:")["input_ids"]
    assert row.columns == {"ground_truth": "45", "source": "b"}


def test_missing_prompt_key_names_source_and_record(tokenizer) -> None:
    records = [RECORDS[0], {"question": "x"}]
    with pytest.raises(DataFileError, match=r"train\.jsonl: record 2 has no 'prompt' column \(it has: question\)"):
        PromptDataset(records, tokenizer=tokenizer, source="train.jsonl")


def test_custom_prompt_key(tokenizer) -> None:
    dataset = PromptDataset([{"question": "abc", "answer": "1"}], prompt_key="question", tokenizer=tokenizer)
    assert dataset[0].prompt_text == "abc" and dataset[0].columns == {"answer": "1"}


def test_overlong_error(tokenizer) -> None:
    with pytest.raises(DataFileError, match=r"p\.jsonl: record 3: prompt is 15 tokens, over max_prompt_length=13"):
        PromptDataset(RECORDS, tokenizer=tokenizer, max_prompt_length=13, source="p.jsonl")


def test_overlong_truncate_keeps_the_end(tokenizer) -> None:
    dataset = PromptDataset(RECORDS, tokenizer=tokenizer, max_prompt_length=5, overlong="truncate")
    assert len(dataset) == 3 and dataset.truncated == 3
    assert [row.prompt_text for row in dataset] == [" 2 3:", " 4 5:", " 8 9:"]
    assert all(len(row.prompt_ids) == 5 for row in dataset)


def test_overlong_skip_counts(tokenizer) -> None:
    dataset = PromptDataset(RECORDS, tokenizer=tokenizer, max_prompt_length=13, overlong="skip")
    assert [row.index for row in dataset] == [0, 1]
    assert dataset.skipped == 1
    with pytest.raises(DataFileError, match="all 3 prompts are longer"):
        PromptDataset(RECORDS, tokenizer=tokenizer, max_prompt_length=2, overlong="skip")


def test_unknown_overlong_policy(tokenizer) -> None:
    with pytest.raises(DataConfigError, match="error, truncate, skip"):
        PromptDataset(RECORDS, tokenizer=tokenizer, overlong="drop")


def test_chat_template_strings_and_messages(tokenizer) -> None:
    records = [
        {"prompt": "hi"},
        {"prompt": [{"role": "system", "content": "terse"}, {"role": "user", "content": "yo"}]},
    ]
    dataset = PromptDataset(records, tokenizer=tokenizer, apply_chat_template=True)
    assert dataset[0].prompt_text == "user: hi\nassistant: "
    assert dataset[1].prompt_text == "system: terse\nuser: yo\nassistant: "


def test_messages_without_chat_template_are_rejected(tokenizer) -> None:
    records = [{"prompt": [{"role": "user", "content": "yo"}]}]
    with pytest.raises(DataFileError, match="record 1: the prompt is a list of messages; set apply_chat_template"):
        PromptDataset(records, tokenizer=tokenizer)


def test_from_file_names_the_file(tmp_path, tokenizer) -> None:
    path = _jsonl(tmp_path / "train.jsonl", [json.dumps({"text": "x"})])
    with pytest.raises(DataFileError, match=r"train\.jsonl: record 1 has no 'prompt' column"):
        PromptDataset.from_file(path, tokenizer=tokenizer)


# --------------------------------------------------------------------------- batching


def _numbers(n: int) -> list[int]:
    return list(range(n))


def test_batcher_covers_each_epoch_and_reshuffles() -> None:
    batcher = PromptBatcher(_numbers(10), batch_size=3, seed=1)
    assert len(batcher) == 3
    epoch0 = [next(batcher) for _ in range(3)]
    epoch1 = [next(batcher) for _ in range(3)]
    assert all(len(batch) == 3 for batch in epoch0 + epoch1)
    assert len({x for batch in epoch0 for x in batch}) == 9  # one item dropped with drop_last
    assert epoch0 != epoch1
    assert batcher.state_dict() == {"epoch": 1, "position": 9}


def test_batcher_is_deterministic_and_without_drop_last() -> None:
    a = PromptBatcher(_numbers(10), batch_size=4, seed=5, drop_last=False)
    b = PromptBatcher(_numbers(10), batch_size=4, seed=5, drop_last=False)
    batches = [next(a) for _ in range(6)]
    assert batches == [next(b) for _ in range(6)]
    assert [len(x) for x in batches] == [4, 4, 2, 4, 4, 2]
    assert sorted(x for batch in batches[:3] for x in batch) == _numbers(10)


def test_batcher_without_shuffle_keeps_order() -> None:
    batcher = PromptBatcher(_numbers(4), batch_size=2, seed=0, shuffle=False)
    assert [next(batcher) for _ in range(3)] == [[0, 1], [2, 3], [0, 1]]


def test_batcher_resume_continues_exactly() -> None:
    original = PromptBatcher(_numbers(11), batch_size=3, seed=42)
    for _ in range(5):  # into the second epoch
        next(original)
    state = original.state_dict()
    expected = [next(original) for _ in range(7)]
    resumed = PromptBatcher(_numbers(11), batch_size=3, seed=42)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert [next(resumed) for _ in range(7)] == expected


def test_batcher_rejects_oversized_batches_and_bad_state() -> None:
    with pytest.raises(DataConfigError, match="batch_size=8 is larger than the 5 prompts"):
        PromptBatcher(_numbers(5), batch_size=8, seed=0)
    assert len(next(PromptBatcher(_numbers(5), batch_size=8, seed=0, drop_last=False))) == 5
    batcher = PromptBatcher(_numbers(5), batch_size=2, seed=0)
    with pytest.raises(DataConfigError, match="missing"):
        batcher.load_state_dict({"epoch": 0})
    with pytest.raises(DataConfigError, match="does not fit"):
        batcher.load_state_dict({"epoch": 0, "position": 9})


def test_batcher_over_dataset_yields_rows(tokenizer) -> None:
    dataset = PromptDataset(RECORDS, tokenizer=tokenizer)
    batch = next(PromptBatcher(dataset, batch_size=2, seed=0))
    assert {row.index for row in batch} <= {0, 1, 2} and len(batch) == 2


# --------------------------------------------------------------------------- collate


def test_collate_left_pads_and_gathers_columns(tokenizer) -> None:
    records = [RECORDS[0], {"prompt": "ab", "ground_truth": "x"}]
    rows = list(PromptDataset(records, tokenizer=tokenizer))
    input_ids, attention_mask, columns = collate_prompts(rows, tokenizer, tokenizer.pad_token_id)
    assert input_ids.dtype == torch.long and input_ids.shape == (2, 13)
    assert attention_mask[1].tolist() == [0] * 11 + [1, 1]
    assert input_ids[1, :11].tolist() == [tokenizer.pad_token_id] * 11
    assert tokenizer.batch_decode(input_ids, skip_special_tokens=True) == ["digits 1 2 3:", "ab"]
    assert columns == {
        "ground_truth": ["123", "x"],
        "source": ["a", None],
        "prompt_text": ["digits 1 2 3:", "ab"],
    }


def test_collate_needs_a_pad_id() -> None:
    with pytest.raises(ValueError, match="pad"):
        collate_prompts(list(PromptDataset(RECORDS, tokenizer=CharTokenizer())), None, None)
