"""CharTokenizer behaves like a Hugging Face tokenizer for inline models."""

from __future__ import annotations

import json

import pytest
import torch

from rlhfctl.models.tokenizer import CharTokenizer


@pytest.fixture
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


def test_vocabulary_layout(tokenizer: CharTokenizer) -> None:
    assert tokenizer.vocab_size == len(tokenizer) == 100
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    assert tokenizer.bos_token is None
    assert tokenizer.convert_tokens_to_ids(" ") == 3
    assert tokenizer.convert_tokens_to_ids("\n") == 98
    assert len(set(tokenizer.get_vocab().values())) == tokenizer.vocab_size


def test_round_trip_and_unknown_characters(tokenizer: CharTokenizer) -> None:
    text = "digits 4 7 1:\nassistant: 471 ~{}"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no special tokens added
    assert tokenizer.decode(ids) == text
    ids = tokenizer("a\té")["input_ids"]
    assert ids[1:] == [tokenizer.unk_token_id] * 2
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a"


def test_left_padding_and_batch_decode(tokenizer: CharTokenizer) -> None:
    batch = tokenizer(["ab", "abcd"], padding=True, return_tensors="pt")
    assert batch["input_ids"].shape == (2, 4)
    assert batch["input_ids"][0, :2].tolist() == [tokenizer.pad_token_id] * 2
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    with_eos = torch.cat([batch["input_ids"], torch.full((2, 1), tokenizer.eos_token_id)], dim=1)
    assert tokenizer.batch_decode(with_eos, skip_special_tokens=True) == ["ab", "abcd"]
    assert tokenizer.batch_decode(with_eos)[0] == "<pad><pad>ab<eos>"


def test_padding_side_is_settable() -> None:
    tokenizer = CharTokenizer(padding_side="right")
    assert tokenizer(["a", "abc"], padding=True)["input_ids"][0] == [tokenizer.convert_tokens_to_ids("a"), 0, 0]
    tokenizer.padding_side = "left"
    assert tokenizer(["a", "abc"], padding=True)["input_ids"][0][-1] == tokenizer.convert_tokens_to_ids("a")


def test_truncation(tokenizer: CharTokenizer) -> None:
    assert tokenizer("hello", truncation=True, max_length=3)["input_ids"] == tokenizer("hel")["input_ids"]


def test_optional_bos_keeps_vocab_size() -> None:
    tokenizer = CharTokenizer(bos_token="<bos>")
    assert tokenizer.bos_token_id == 99
    assert tokenizer.vocab_size == len(tokenizer) == 100


def test_chat_template(tokenizer: CharTokenizer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == "system: be brief\nuser: hi\n"
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "system: be brief\nuser: hi\nassistant: "


def test_save_and_load_round_trip(tmp_path, tokenizer: CharTokenizer) -> None:
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    # Plain transformers reads the fast class from tokenizer.json; rlhfctl reads the marker (test_export_loads_anywhere).
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["rlhfctl_tokenizer"] == "CharTokenizer"
    assert (tmp_path / "tokenizer.json").is_file()
    loaded = CharTokenizer.from_pretrained(tmp_path)
    assert loaded.get_vocab() == tokenizer.get_vocab()
    assert loaded.padding_side == "left"
    assert loaded.pad_token == "<pad>" and loaded.eos_token == "<eos>"
    messages = [{"role": "user", "content": "x"}]
    assert loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == "user: x\nassistant: "
    assert loaded("a<eos>b")["input_ids"] == tokenizer("a<eos>b")["input_ids"]
