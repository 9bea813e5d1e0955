"""The decoding steps' 4D attention mask: built once per rollout, the same tokens as the per-step 2D mask."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen2 import modeling_qwen2

from rlhfctl.models.loading import load_causal_lm
from tests.workers.recipes import TINY_MODEL, left_padded_prompt_ids, tokenizer
from rlhfctl.rollout import generation
from rlhfctl.rollout.decode_mask import decode_attention_mask
from rlhfctl.engine.forward import cache_from, lm_forward
from rlhfctl.rollout.generation import SamplingParams, sample_responses
from rlhfctl.rollout.kv_cache import preallocated_cache
from rlhfctl.engine.log_probs import position_ids_from_mask


@pytest.fixture(autouse=True)
def transformers_decoding_steps(monkeypatch):
    """These tests are about the mask transformers' decoding step gets: keep the fast decoder out."""
    monkeypatch.setenv("RLHFCTL_FAST_DECODE", "0")


def tiny_model(attn_implementation: str, **config_overrides):
    model_cfg = {**TINY_MODEL, "config": {**TINY_MODEL["config"], **config_overrides},
                 "attn_implementation": attn_implementation}
    return load_causal_lm(model_cfg, tokenizer(), seed=0).eval()


def left_padded_prompts():
    return left_padded_prompt_ids(4, 7, {0: 4, 1: 1})


def sample(model, samples_per_prompt=3, max_new_tokens=12):
    ids, mask = left_padded_prompts()
    params = SamplingParams(n=samples_per_prompt, max_new_tokens=max_new_tokens, temperature=1.0)
    return sample_responses(model, ids, mask, params, eos_ids=[10_000], pad_id=0,
                            generator=torch.Generator().manual_seed(7), samples_per_prompt=samples_per_prompt)


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_the_prebuilt_mask_samples_the_same_tokens_as_the_per_step_mask(kernel, monkeypatch):
    model = tiny_model(kernel)
    prebuilt = sample(model)
    monkeypatch.setattr(generation, "decode_attention_mask", lambda *args: None)
    per_step = sample(model)
    assert prebuilt[0].shape == (12, 12)
    assert torch.equal(prebuilt[0], per_step[0]) and torch.equal(prebuilt[1], per_step[1])


def decode_step_logits(model, step_mask_for):
    """Logits of two decoding steps after a prompt pass, each given ``step_mask_for(2D mask so far)``."""
    ids, mask = left_padded_prompts()
    positions = position_ids_from_mask(mask)
    with torch.inference_mode():
        out = lm_forward(model, ids, mask, positions, cache=preallocated_cache(model, 10), use_cache=True)
        cache, next_position, logits = cache_from(out), positions[:, -1:] + 1, []
        for token in (11, 12):
            mask = torch.cat([mask, torch.ones(4, 1, dtype=mask.dtype)], dim=1)
            out = lm_forward(model, torch.full((4, 1), token), step_mask_for(mask), next_position, cache=cache,
                             use_cache=True)
            cache, next_position = cache_from(out), next_position + 1
            logits.append(out.logits[:, -1])
    return torch.stack(logits)


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_decoding_logits_match_the_2d_mask_and_padding_stays_hidden(kernel):
    model = tiny_model(kernel)
    _, prompt_mask = left_padded_prompts()
    prebuilt = decode_attention_mask(model, prompt_mask, max_new_tokens=3)
    reference = decode_step_logits(model, lambda mask: mask)
    ours = decode_step_logits(model, lambda mask: prebuilt[..., : mask.shape[1]])
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    # The check has teeth: letting the padded row see its padding changes its logits.
    unmasked = decode_step_logits(model, lambda mask: torch.ones_like(mask))
    assert (unmasked[:, 0] - reference[:, 0]).abs().max() > 1e-3
    torch.testing.assert_close(unmasked[:, 2:], reference[:, 2:], rtol=1e-5, atol=1e-5)  # rows without padding


def test_transformers_builds_a_mask_for_the_prompt_pass_only(monkeypatch):
    calls = []
    original = modeling_qwen2.create_causal_mask

    def counting(*args, **kwargs):
        mask = kwargs.get("attention_mask")
        calls.append(None if mask is None else mask.dim())
        return original(*args, **kwargs)

    monkeypatch.setattr(modeling_qwen2, "create_causal_mask", counting)
    sample(tiny_model("sdpa"), samples_per_prompt=2, max_new_tokens=6)
    # One 2D mask for the prompt pass; the 5 decoding steps hand over 4D masks, returned as they are.
    assert calls == [2, 4, 4, 4, 4, 4]


def test_mask_formats_follow_the_attention_kernel():
    _, prompt_mask = left_padded_prompts()
    sdpa = decode_attention_mask(tiny_model("sdpa"), prompt_mask, max_new_tokens=5)
    assert sdpa.dtype == torch.bool and sdpa.shape == (4, 1, 1, 12)
    assert sdpa[0, 0, 0].tolist() == [False] * 4 + [True] * 8  # padding hidden, prompt and responses visible
    eager = decode_attention_mask(tiny_model("eager"), prompt_mask, max_new_tokens=5)
    assert eager.dtype == torch.float32 and eager.shape == (4, 1, 1, 12)
    assert eager[1, 0, 0, 0] == torch.finfo(torch.float32).min and bool((eager[1, 0, 0, 1:] == 0).all())


def test_other_families_and_kernels_keep_the_per_step_mask():
    _, prompt_mask = left_padded_prompts()
    model = tiny_model("sdpa")
    model.config.model_type = "bloom"  # ALiBi families read the 2D mask for more than masking
    assert decode_attention_mask(model, prompt_mask, max_new_tokens=5) is None
    model = tiny_model("sdpa")
    model.config._attn_implementation = "flex_attention"
    assert decode_attention_mask(model, prompt_mask, max_new_tokens=5) is None
    assert decode_attention_mask(torch.nn.Linear(2, 2), prompt_mask, max_new_tokens=5) is None
