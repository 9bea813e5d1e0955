"""Tokenizers and models built from a recipe's ``model`` section (hub/local path or inline config)."""

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

__all__ = [
    "CausalLMWithValueHead",
    "CharTokenizer",
    "ModelConfigError",
    "build_config",
    "load_causal_lm",
    "load_sequence_classifier",
    "load_token_value_model",
    "load_tokenizer",
    "resolve_dtype",
    "save_hf_model",
    "token_values",
]
