"""model.gradient_checkpointing: activations are recomputed, without transformers' deprecation warning."""

from __future__ import annotations

import warnings

import torch

from rlhfctl.models.loading import CausalLMWithValueHead, build_config, load_causal_lm
from tests.workers.recipes import TINY_MODEL, tokenizer
from rlhfctl.engine.training import enable_activation_checkpointing


def _is_checkpointing(model) -> bool:
    return bool(getattr(model, "is_activation_checkpointing", None) or getattr(model, "is_gradient_checkpointing"))


def test_policy_and_value_models_recompute_activations_without_a_warning():
    policy = load_causal_lm(TINY_MODEL, tokenizer(), seed=0)
    value = CausalLMWithValueHead.from_config(build_config(TINY_MODEL, tokenizer()), seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        enable_activation_checkpointing(policy)
        enable_activation_checkpointing(value)
    assert _is_checkpointing(policy) and _is_checkpointing(value.backbone)
    policy.train()
    ids = torch.randint(5, 60, (2, 7))
    loss = policy(input_ids=ids).logits.float().logsumexp(-1).mean()
    loss.backward()  # the recomputing backward runs and reaches the embeddings
    assert policy.get_input_embeddings().weight.grad is not None
