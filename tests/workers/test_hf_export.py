"""The streamed Hugging Face export (rlhfctl/engine/hf_export.py) on one process: the same files as
``save_pretrained`` (split, names, tensors), a LoRA merge equal to peft's, a value model's head file."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import load_file

from rlhfctl.models.loading import CausalLMWithValueHead, build_config, load_causal_lm
from tests.workers.recipes import TINY_MODEL, tokenizer
from rlhfctl.engine.checkpointing import save_hf_directory
from rlhfctl.engine.hf_export import export_plan, split_files
from rlhfctl.engine.lora import apply_lora, merged_copy


def tensors(directory: Path) -> dict[str, torch.Tensor]:
    found = {}
    for path in sorted(directory.glob("model*.safetensors")):
        found.update(load_file(str(path)))
    return found


def assert_same_tensors(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name


def test_files_split_as_save_pretrained_splits_them(tmp_path):
    model = load_causal_lm({"config": {**TINY_MODEL["config"], "tie_word_embeddings": True}}, tokenizer(), seed=1)
    bound = 9_000
    weights, _ = export_plan(model)
    ours = [[entry.name for entry in entries] for entries in split_files(weights, bound)]
    state = {entry.name: model.state_dict()[entry.source] for entry in weights}
    theirs = split_torch_state_dict_into_shards(state, max_shard_size=bound)
    assert ours == list(theirs.filename_to_tensors.values()) and len(ours) > 2
    assert "lm_head.weight" not in state  # the tied alias, as save_pretrained leaves it out

    save_hf_directory(model, tokenizer(), tmp_path / "ours", max_shard_bytes=bound)
    model.save_pretrained(tmp_path / "theirs", max_shard_size=bound)
    assert_same_tensors(tensors(tmp_path / "ours"), tensors(tmp_path / "theirs"))
    index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
    reference = json.loads((tmp_path / "theirs" / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == reference["weight_map"]
    assert index["metadata"]["total_size"] == reference["metadata"]["total_size"]


def test_a_lora_export_equals_peft_merge_and_unload(tmp_path):
    model = apply_lora(load_causal_lm(TINY_MODEL, tokenizer(), seed=2), {"r": 4, "alpha": 8}, seed=0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    save_hf_directory(model, tokenizer(), tmp_path / "ours")
    merged_copy(model).save_pretrained(tmp_path / "theirs")
    assert_same_tensors(tensors(tmp_path / "ours"), tensors(tmp_path / "theirs"))  # float32: to the bit
    save_hf_directory(model, tokenizer(), tmp_path / "bf16", dtype=torch.bfloat16)
    exported = tensors(tmp_path / "bf16")
    assert {tensor.dtype for tensor in exported.values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    # bf16: base, A and B are cast first, then merged in float32 (as the export always did); the difference
    # to peft's float32 merge is bf16 rounding, a few units in the last place of the largest entries.
    for name, tensor in tensors(tmp_path / "theirs").items():
        torch.testing.assert_close(exported[name].float(), tensor, atol=2**-7 * float(tensor.abs().max()), rtol=0, msg=name)


def test_a_value_model_exports_its_backbone_and_head_file(tmp_path):
    config = build_config(TINY_MODEL, tokenizer())
    model = CausalLMWithValueHead.from_config(config, seed=3)
    save_hf_directory(model, tokenizer(), tmp_path / "ours")
    model.save_pretrained(tmp_path / "theirs")
    assert_same_tensors(tensors(tmp_path / "ours"), tensors(tmp_path / "theirs"))
    head = load_file(str(tmp_path / "ours" / "value_head.safetensors"))
    assert_same_tensors(head, load_file(str(tmp_path / "theirs" / "value_head.safetensors")))
    loaded = CausalLMWithValueHead.from_pretrained(tmp_path / "ours")
    ids = torch.arange(5, 17).reshape(2, 6)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)
