"""An exported inline model (character tokenizer) loads with plain transformers, in a process without rlhfctl.

The directories are written the two ways rlhfctl writes them: ``save_hf_directory`` (checkpoints' ``hf/`` and
the workers' ``export_hf``) and ``save_hf_model``. A subprocess that cannot import rlhfctl loads each with
``AutoTokenizer`` and ``AutoModelForCausalLM``, encodes, decodes and generates greedily; the ids must be the
character tokenizer's and the generated tokens the in-memory model's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from rlhfctl.engine.checkpointing import save_hf_directory
from rlhfctl.models.loading import load_causal_lm, load_tokenizer, save_hf_model
from rlhfctl.models.tokenizer import (
    MARKER_KEY,
    PORTABLE_TOKENIZER_CLASS,
    CharTokenizer,
    is_char_tokenizer_config,
    is_char_tokenizer_dir,
)

TINY = {
    "qwen2": {"model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 64},
    "llama": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 64},
}
EXPORTERS = {"save_hf_directory": save_hf_directory, "save_hf_model": save_hf_model}
PROMPT = "user: capital of peru?"
MESSAGES = [{"role": "user", "content": "capital of peru?"}]
NEW_TOKENS = 12
ASCII_TEXTS = [PROMPT, "a b\nc", "digits 4 7 1:\nassistant: 471 ~{}", "  two  spaces\n\n", "a<eos>b<pad>", "<bos>x"]
"""Every character in the vocabulary: every tokenizer transformers may build from the directory keeps these."""
UNKNOWN_TEXTS = ["a\tb", "café", "e\u0301x", "emoji 😀!", "\r\n"]
"""Characters outside the vocabulary: ``<unk>`` each, except where transformers forces its own class (see below)."""

# Runs with `python -I` from a directory outside the repository, rlhfctl (and the repo's workers package) blocked.
LOADER = r"""
import json, sys
sys.modules["rlhfctl"] = None
sys.modules["workers"] = None
try:
    import rlhfctl  # noqa: F401
    blocked = False
except ImportError:
    blocked = True
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

spec = json.loads(sys.argv[1])
results = {"blocked": blocked, "dirs": {}}
for directory in spec["dirs"]:
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    encoded = tokenizer(spec["prompt"], return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**encoded, max_new_tokens=spec["new_tokens"], do_sample=False)
    texts = spec["ascii"] + spec["unknown"]
    results["dirs"][directory] = {
        "tokenizer_class": type(tokenizer).__name__,
        "padding_side": tokenizer.padding_side,
        "special": [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id, tokenizer.bos_token_id],
        "prompt_ids": encoded["input_ids"][0].tolist(),
        "generated": output[0].tolist(),
        "decoded": tokenizer.decode(output[0], skip_special_tokens=True),
        "ids": {text: tokenizer(text)["input_ids"] for text in texts},
        "round_trip": {text: tokenizer.decode(tokenizer(text)["input_ids"]) for text in texts},
        "chat": tokenizer.apply_chat_template(spec["messages"], tokenize=False, add_generation_prompt=True),
    }
results["rlhfctl_loaded"] = any(name == "rlhfctl" or name.startswith("rlhfctl.") for name, module in sys.modules.items()
                                if module is not None)
print(json.dumps(results))
"""


def _ids(tokenizer: CharTokenizer, text: str) -> list[int]:
    return tokenizer(text)["input_ids"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """Export each tiny model both ways, load every directory in one rlhfctl-free subprocess, and return both sides."""
    root = tmp_path_factory.mktemp("exports")
    tokenizer = load_tokenizer({"config": TINY["qwen2"]})
    expected, dirs = {}, []
    for name, config in TINY.items():
        model = load_causal_lm({"config": config}, tokenizer, seed=0).eval()
        encoded = tokenizer(PROMPT, return_tensors="pt")
        with torch.no_grad():
            generated = model.generate(**encoded, max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
        for exporter, export in EXPORTERS.items():
            directory = root / f"{name}-{exporter}"
            export(model, tokenizer, directory)
            dirs.append(str(directory))
            expected[str(directory)] = {"model_type": name, "generated": generated}
    spec = {"dirs": dirs, "prompt": PROMPT, "new_tokens": NEW_TOKENS, "messages": MESSAGES,
            "ascii": ASCII_TEXTS, "unknown": UNKNOWN_TEXTS}
    outside = tmp_path_factory.mktemp("elsewhere")
    done = subprocess.run([sys.executable, "-I", "-c", LOADER, json.dumps(spec)], cwd=outside, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # -I: no PYTHONPATH
    assert done.returncode == 0, done.stderr[-4000:]
    return {"tokenizer": tokenizer, "expected": expected,
            "loaded": json.loads(done.stdout.strip().splitlines()[-1])}


def test_the_subprocess_ran_without_rlhfctl(exported) -> None:
    assert exported["loaded"]["blocked"] and not exported["loaded"]["rlhfctl_loaded"]


@pytest.mark.parametrize("name", sorted(TINY))
@pytest.mark.parametrize("exporter", sorted(EXPORTERS))
def test_plain_transformers_encodes_and_generates_as_rlhfctl(exported, name, exporter) -> None:
    tokenizer: CharTokenizer = exported["tokenizer"]
    directory = next(d for d, e in exported["expected"].items() if d.endswith(f"{name}-{exporter}"))
    loaded, expected = exported["loaded"]["dirs"][directory], exported["expected"][directory]
    assert loaded["prompt_ids"] == _ids(tokenizer, PROMPT)
    assert loaded["generated"] == expected["generated"]
    assert len(loaded["generated"]) > len(loaded["prompt_ids"])
    assert loaded["decoded"] == tokenizer.decode(expected["generated"], skip_special_tokens=True)
    assert loaded["special"] == [0, 1, 2, None] and loaded["padding_side"] == "left"
    assert loaded["chat"] == tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    for text in ASCII_TEXTS:
        assert loaded["ids"][text] == _ids(tokenizer, text), text
        assert loaded["round_trip"][text] == text
    if loaded["tokenizer_class"] == "Qwen2Tokenizer":
        # transformers 5 builds Qwen2Tokenizer for a qwen2 config whatever tokenizer_class says; it keeps the
        # vocabulary of tokenizer.json but not its pipeline (NFC first), and drops what is not in the vocabulary.
        for text in UNKNOWN_TEXTS:
            kept = [i for i in _ids(tokenizer, unicodedata.normalize("NFC", text)) if i != tokenizer.unk_token_id]
            assert loaded["ids"][text] == kept, text
    else:
        for text in UNKNOWN_TEXTS:
            assert loaded["ids"][text] == _ids(tokenizer, text), text
            assert loaded["round_trip"][text] == tokenizer.decode(_ids(tokenizer, text))


def test_saved_config_names_the_fast_class_and_the_marker(tmp_path) -> None:
    tokenizer = CharTokenizer(bos_token="<bos>")
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == PORTABLE_TOKENIZER_CLASS and config[MARKER_KEY] == "CharTokenizer"
    assert (config["pad_token"], config["eos_token"], config["unk_token"], config["bos_token"]) == (
        "<pad>", "<eos>", "<unk>", "<bos>")
    assert config["padding_side"] == "left" and config["chat_template"] == tokenizer.chat_template
    assert (tmp_path / "tokenizer.json").is_file() and is_char_tokenizer_dir(tmp_path)
    # A tokenizer-only directory (no config.json): AutoTokenizer builds the generic fast tokenizer.
    fast = AutoTokenizer.from_pretrained(tmp_path)
    assert fast.is_fast and len(fast) == len(tokenizer) == 100
    assert (fast.bos_token_id, fast.pad_token_id, fast.eos_token_id, fast.unk_token_id) == (99, 0, 1, 2)
    assert fast("a<bos>b")["input_ids"] == _ids(tokenizer, "a<bos>b") == [68, 99, 69]


def test_rlhfctl_still_loads_its_char_tokenizer_new_and_old_directories(tmp_path) -> None:
    tokenizer = CharTokenizer()
    tokenizer.save_pretrained(tmp_path / "new")
    assert isinstance(load_tokenizer({"path": str(tmp_path / "new")}), CharTokenizer)
    # A directory saved before tokenizer.json: tokenizer_class CharTokenizer and nothing else.
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "CharTokenizer", "pad_token": "<pad>", "eos_token": "<eos>", "unk_token": "<unk>",
         "padding_side": "left"}))
    old = load_tokenizer({"path": str(tmp_path / "old")})
    assert isinstance(old, CharTokenizer) and _ids(old, "a\nb") == [68, 98, 69]
    assert is_char_tokenizer_config({"tokenizer_class": "CharTokenizer"})
    assert is_char_tokenizer_config({"tokenizer_class": "Qwen2Tokenizer", MARKER_KEY: "CharTokenizer"})
    assert not is_char_tokenizer_config({"tokenizer_class": PORTABLE_TOKENIZER_CLASS})
    # Saved again by rlhfctl: the same files, the marker kept.
    load_tokenizer({"path": str(tmp_path / "old")}).save_pretrained(tmp_path / "resaved")
    assert (tmp_path / "resaved" / "tokenizer.json").is_file() and is_char_tokenizer_dir(tmp_path / "resaved")


def test_added_tokens_keep_their_ids(tmp_path) -> None:
    tokenizer = CharTokenizer()
    tokenizer.add_tokens(["<tool>"], special_tokens=True)
    tokenizer.save_pretrained(tmp_path)
    fast = AutoTokenizer.from_pretrained(tmp_path)
    assert fast("x<tool>y")["input_ids"] == _ids(tokenizer, "x<tool>y") == [91, 100, 92]


_BACKEND = CharTokenizer().to_tokenizers()
_SLOW = CharTokenizer()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.characters(codec="utf-8"),  # no lone surrogates: tokenizers takes only valid UTF-8
                          st.sampled_from(["\n", " ", "a", "<eos>", "<pad>", "<bos>"]))).map("".join))
def test_tokenizer_json_gives_the_char_tokenizer_ids_for_any_text(text: str) -> None:
    ids = _BACKEND.encode(text, add_special_tokens=False).ids
    assert ids == _ids(_SLOW, text)
    assert _BACKEND.decode(ids, skip_special_tokens=False) == _SLOW.decode(ids)
    if _SLOW.unk_token_id not in ids:
        assert _BACKEND.decode(ids, skip_special_tokens=False) == text
