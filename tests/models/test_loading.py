"""Model and tokenizer loading from recipe model sections (inline configs only: no downloads)."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.models.loading import (
    CausalLMWithValueHead,
    ModelConfigError,
    build_config,
    load_causal_lm,
    load_sequence_classifier,
    load_token_value_model,
    load_tokenizer,
    resolve_dtype,
    save_hf_model,
    token_values,
)
from rlhfctl.models.tokenizer import CharTokenizer

TINY = {
    "qwen2": {"model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 64},
    "llama": {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 64},
    "gpt2": {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_inner": 64, "n_positions": 64},
}
# gptj has no token-classification head in transformers: exercises the value-head fallback.
NO_TOKEN_HEAD = {"model_type": "gptj", "n_embd": 32, "n_layer": 2, "n_head": 2, "rotary_dim": 8, "n_positions": 64}


@pytest.fixture(scope="module")
def tokenizer() -> CharTokenizer:
    return load_tokenizer({"config": TINY["qwen2"]})


@pytest.fixture(scope="module")
def batch(tokenizer):
    return tokenizer(["digits 1 2:", "hi"], padding=True, return_tensors="pt")


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_inline_tokenizer_is_char_tokenizer(tokenizer) -> None:
    assert isinstance(tokenizer, CharTokenizer)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None


@pytest.mark.parametrize("name", sorted(TINY))
def test_inline_causal_lm_builds_and_runs(name, tokenizer, batch) -> None:
    model = load_causal_lm({"config": TINY[name]}, tokenizer, seed=0)
    logits = model(**batch).logits
    assert logits.shape == (*batch["input_ids"].shape, len(tokenizer))
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.config.eos_token_id == tokenizer.eos_token_id


def test_config_takes_vocab_and_special_ids_from_tokenizer(tokenizer) -> None:
    config = build_config({"config": TINY["llama"]}, tokenizer)
    assert config.vocab_size == len(tokenizer)
    assert (config.pad_token_id, config.eos_token_id, config.bos_token_id) == (0, 1, None)
    assert config.num_key_value_heads == 4  # defaults to num_attention_heads for tiny configs
    given = build_config({"config": {**TINY["llama"], "vocab_size": 128, "eos_token_id": 5}}, tokenizer)
    assert (given.vocab_size, given.eos_token_id) == (128, 5)


def test_same_seed_same_weights(tokenizer) -> None:
    cfg = {"config": TINY["qwen2"]}
    first = load_causal_lm(cfg, tokenizer, seed=7)
    state = torch.get_rng_state()
    second = load_causal_lm(cfg, tokenizer, seed=7)
    assert torch.equal(state, torch.get_rng_state())  # the caller's generator is left alone
    assert _same_weights(first, second)
    assert not _same_weights(first, load_causal_lm(cfg, tokenizer, seed=8))


def test_dtype_is_applied(tokenizer) -> None:
    model = load_causal_lm({"config": TINY["qwen2"]}, tokenizer, dtype="bf16", seed=0)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert resolve_dtype("float32") is torch.float32
    with pytest.raises(ModelConfigError, match="unknown dtype"):
        resolve_dtype("float8")


def test_save_then_load_through_path(tmp_path, tokenizer, batch) -> None:
    model = load_causal_lm({"config": TINY["qwen2"]}, tokenizer, seed=0).eval()
    save_hf_model(model, tokenizer, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    cfg = {"path": str(tmp_path / "ckpt")}
    loaded_tokenizer = load_tokenizer(cfg)
    assert isinstance(loaded_tokenizer, CharTokenizer)
    loaded = load_causal_lm(cfg, loaded_tokenizer).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, loaded(**batch).logits, rtol=0, atol=1e-6)
    with pytest.warns(UserWarning, match="ignoring model.config"):
        from_both = load_causal_lm({**cfg, "config": TINY["llama"]}, loaded_tokenizer)
    assert from_both.config.model_type == "qwen2"


def test_tokenizer_path_overrides(tmp_path, tokenizer) -> None:
    tokenizer.save_pretrained(tmp_path / "tok")
    loaded = load_tokenizer({"config": TINY["qwen2"], "tokenizer_path": str(tmp_path / "tok")})
    assert isinstance(loaded, CharTokenizer) and loaded.padding_side == "left"


@pytest.mark.parametrize("name", ["qwen2", "gpt2"])
def test_value_model_gives_per_token_values(name, tokenizer, batch) -> None:
    model = load_token_value_model({"config": TINY[name]}, tokenizer, seed=0)
    assert not isinstance(model, CausalLMWithValueHead)
    assert model(**batch).logits[..., 0].shape == batch["input_ids"].shape
    assert token_values(model, batch["input_ids"], batch["attention_mask"]).shape == batch["input_ids"].shape


def test_value_model_round_trip(tmp_path, tokenizer, batch) -> None:
    model = load_token_value_model({"config": TINY["qwen2"]}, tokenizer, seed=0).eval()
    save_hf_model(model, tokenizer, tmp_path)
    loaded = load_token_value_model({"path": str(tmp_path)}, tokenizer).eval()
    with torch.no_grad():
        torch.testing.assert_close(token_values(model, **batch), token_values(loaded, **batch), rtol=0, atol=1e-6)


def test_value_head_fallback(tmp_path, tokenizer, batch) -> None:
    model = load_token_value_model({"config": NO_TOKEN_HEAD}, tokenizer, seed=3).eval()
    assert isinstance(model, CausalLMWithValueHead)
    values = model(batch["input_ids"], batch["attention_mask"])
    assert values.shape == batch["input_ids"].shape
    assert _same_weights(model, load_token_value_model({"config": NO_TOKEN_HEAD}, tokenizer, seed=3))
    save_hf_model(model, tokenizer, tmp_path)
    assert (tmp_path / "value_head.safetensors").is_file()
    loaded = load_token_value_model({"path": str(tmp_path)}, tokenizer).eval()
    assert isinstance(loaded, CausalLMWithValueHead)
    with torch.no_grad():
        torch.testing.assert_close(token_values(model, **batch), token_values(loaded, **batch), rtol=0, atol=1e-6)


def test_sequence_classifier(tokenizer, batch) -> None:
    model = load_sequence_classifier({"config": TINY["llama"]}, tokenizer, seed=0)
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model(**batch).logits.shape == (2, 1)


def test_missing_source_is_explained(tokenizer) -> None:
    for call in (lambda: load_tokenizer({}), lambda: load_causal_lm({}, tokenizer)):
        with pytest.raises(ModelConfigError, match="neither 'path' nor 'config'"):
            call()


def test_unknown_model_type_lists_known_ones(tokenizer) -> None:
    with pytest.raises(ModelConfigError, match="unknown model_type 'qwen9'.*qwen2.*llama"):
        load_causal_lm({"config": {**TINY["qwen2"], "model_type": "qwen9"}}, tokenizer)
    with pytest.raises(ModelConfigError, match="needs a model_type"):
        build_config({"config": {"hidden_size": 32}}, tokenizer)


def test_vocab_smaller_than_tokenizer_is_rejected(tokenizer) -> None:
    with pytest.raises(ModelConfigError, match="smaller than the tokenizer"):
        build_config({"config": {**TINY["qwen2"], "vocab_size": 10}}, tokenizer)


@pytest.mark.parametrize("path", ["./no/such/model", "/no/such/model", "~/no/such/model"])
def test_missing_local_path(path, tokenizer) -> None:
    with pytest.raises(ModelConfigError, match="does not exist"):
        load_causal_lm({"path": path}, tokenizer)
    with pytest.raises(ModelConfigError, match="does not exist"):
        load_tokenizer({"path": path})
