"""The fast decoding step: transformers' logits and tokens in fewer ops, only for models it reproduces."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.models.loading import load_causal_lm
from tests.workers.recipes import TINY_MODEL, left_padded_prompt_ids, tokenizer
from rlhfctl.rollout.fast_decode import FastDecoder, fast_decoder
from rlhfctl.engine.forward import base_model, cache_from, lm_forward
from rlhfctl.rollout.generation import SamplingParams, sample_responses
from rlhfctl.rollout.kv_cache import preallocated_cache
from rlhfctl.engine.log_probs import position_ids_from_mask
from rlhfctl.engine.lora import apply_lora

QWEN2 = TINY_MODEL["config"]
# Grouped-query attention, a head size that is not hidden / heads, and biases on every projection.
LLAMA_GQA = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48, "attention_bias": True,
             "mlp_bias": True, "max_position_embeddings": 128}
MISTRAL = {"model_type": "mistral", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 128, "sliding_window": None}
STEPS = 5


def model_for(config: dict, attn_implementation: str = "sdpa", dtype: str | None = None):
    model_cfg = {**TINY_MODEL, "config": dict(config), "attn_implementation": attn_implementation}
    if dtype:
        model_cfg["dtype"] = dtype
    return load_causal_lm(model_cfg, tokenizer(), dtype=dtype, seed=0).eval()


def left_padded_prompts():
    return left_padded_prompt_ids(3, 6, {0: 3, 2: 1})


def prompt_pass(model, ids, mask):
    """The prompt pass into a fresh preallocated cache: (cache, next position)."""
    positions = position_ids_from_mask(mask)
    out = lm_forward(model, ids, mask, positions, cache=preallocated_cache(base_model(model), ids.shape[1] + STEPS),
                     use_cache=True, logits_to_keep=1)
    return cache_from(out), positions[:, -1:] + 1


def both_steps(model):
    """Per-step logits (STEPS, rows, vocab) of transformers' forward and of the fast decoder, same tokens."""
    ids, mask = left_padded_prompts()
    tokens = torch.randint(5, 60, (STEPS, 3, 1), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        cache, position = prompt_pass(model, ids, mask)
        reference, grown = [], mask
        for token in tokens:
            grown = torch.cat([grown, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
            out = lm_forward(model, token, grown, position, cache=cache, use_cache=True, logits_to_keep=1)
            cache, position = cache_from(out), position + 1
            reference.append(out.logits[:, -1])
        cache, position = prompt_pass(model, ids, mask)
        decoder = fast_decoder(base_model(model), cache, mask, STEPS, int(position.max()) + STEPS)
        assert isinstance(decoder, FastDecoder)
        fast = []
        for token in tokens:
            fast.append(decoder.step(token, position))
            position = position + 1
    return torch.stack(reference).float(), torch.stack(fast).float()


@pytest.mark.parametrize("config", [QWEN2, LLAMA_GQA, MISTRAL], ids=["qwen2", "llama-gqa-bias", "mistral"])
@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_fast_steps_give_transformers_logits(config, kernel):
    reference, fast = both_steps(model_for(config, kernel))
    assert fast.shape == (STEPS, 3, len(tokenizer()))
    torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-5)


def test_fast_steps_in_bfloat16_stay_within_its_rounding():
    reference, fast = both_steps(model_for(LLAMA_GQA, dtype="bfloat16"))
    torch.testing.assert_close(fast, reference, rtol=0.0, atol=4e-3)  # about one bfloat16 step at these logits


def test_the_comparison_has_teeth_positions_and_padding_change_the_logits():
    model = model_for(QWEN2)
    ids, mask = left_padded_prompts()
    token = torch.full((3, 1), 7)
    with torch.inference_mode():
        cache, position = prompt_pass(model, ids, mask)
        right = fast_decoder(model, cache, mask, STEPS, 20).step(token, position)
        cache, position = prompt_pass(model, ids, mask)
        shifted = fast_decoder(model, cache, mask, STEPS, 20).step(token, position + 1)
        cache, position = prompt_pass(model, ids, mask)
        padding_seen = fast_decoder(model, cache, torch.ones_like(mask), STEPS, 20).step(token, position)
    assert (right - shifted).abs().max() > 1e-4  # ten times the tolerance above
    assert (right[0] - padding_seen[0]).abs().max() > 1e-4  # row 0 has three padding positions
    torch.testing.assert_close(padding_seen[1], right[1], rtol=1e-5, atol=1e-5)  # row 1 has none


def sample(model, do_sample: bool):
    ids, mask = left_padded_prompts()
    params = SamplingParams(n=2, max_new_tokens=10, temperature=1.0, do_sample=do_sample)
    return sample_responses(model, ids, mask, params, eos_ids=[3], pad_id=0,
                            generator=torch.Generator().manual_seed(5), samples_per_prompt=2)


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_sampling_gives_the_same_tokens_with_and_without_the_fast_step(monkeypatch, do_sample):
    model = model_for(LLAMA_GQA)
    fast = sample(model, do_sample)
    monkeypatch.setenv("RLHFCTL_FAST_DECODE", "0")
    plain = sample(model, do_sample)
    assert fast[0].shape == (6, 10)
    assert torch.equal(fast[0], plain[0]) and torch.equal(fast[1], plain[1])


def decoder_for(model):
    ids, mask = left_padded_prompts()
    with torch.inference_mode():
        cache, _ = prompt_pass(model, ids, mask)
    return fast_decoder(base_model(model), cache, mask, STEPS, 20)


def test_models_it_cannot_reproduce_keep_the_transformers_step(monkeypatch):
    assert decoder_for(model_for(QWEN2)) is not None
    qwen3 = dict(QWEN2, model_type="qwen3")  # q/k norms inside attention
    assert decoder_for(model_for(qwen3)) is None
    assert decoder_for(model_for(MISTRAL)) is not None
    short_window = dict(MISTRAL, sliding_window=4)  # the rollout (6 + 5 positions) outgrows the window
    assert decoder_for(model_for(short_window)) is None
    dynamic_rope = dict(LLAMA_GQA, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    assert decoder_for(model_for(dynamic_rope)) is None
    lora = apply_lora(model_for(QWEN2), {"r": 2, "target_modules": ["q_proj", "v_proj"]}, seed=0)
    assert decoder_for(lora) is None  # an adapter's layers are not plain nn.Linear
    other_rotary = model_for(QWEN2)
    ids, mask = left_padded_prompts()
    with torch.inference_mode():
        cache, _ = prompt_pass(other_rotary, ids, mask)
    other_rotary.model.rotary_emb.forward = lambda x, position_ids, layer_type: None  # wants more arguments
    assert fast_decoder(other_rotary, cache, mask, STEPS, 20) is None
    flex = model_for(QWEN2)
    flex.config._attn_implementation = "flex_attention"
    assert decoder_for(flex) is None
    monkeypatch.setenv("RLHFCTL_FAST_DECODE", "0")
    assert decoder_for(model_for(QWEN2)) is None


def test_the_transformers_cache_is_not_one_it_can_fill():
    model = model_for(QWEN2)
    ids, mask = left_padded_prompts()
    with torch.inference_mode():
        out = lm_forward(model, ids, mask, position_ids_from_mask(mask), use_cache=True)
    assert fast_decoder(model, cache_from(out), mask, STEPS, 20) is None
