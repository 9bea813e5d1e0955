"""The preallocated KV cache: same tokens as transformers' growing cache, filled in place."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.models.loading import load_causal_lm
from tests.workers.recipes import TINY_MODEL, left_padded_prompt_ids, tokenizer
from rlhfctl.rollout import generation
from rlhfctl.rollout.generation import SamplingParams, sample_responses
from rlhfctl.rollout.kv_cache import PreallocatedLayer, preallocated_cache


def tiny_model(**config_overrides):
    model_cfg = {**TINY_MODEL, "config": {**TINY_MODEL["config"], **config_overrides}}
    return load_causal_lm(model_cfg, tokenizer(), seed=0).eval()


def prompts():
    return left_padded_prompt_ids(6, 7, {0: 3, 1: 3})  # left padding on two rows


def sample(model, monkeypatch, cache_factory):
    monkeypatch.setattr(generation, "preallocated_cache", cache_factory)
    ids, mask = prompts()
    params = SamplingParams(n=1, max_new_tokens=12, temperature=1.0)
    return sample_responses(model, ids, mask, params, eos_ids=[10_000], pad_id=0,
                            generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("fast_decode", ["0", "1"])  # transformers' decoding step, and rlhfctl/rollout/fast_decode.py
def test_sampling_with_the_preallocated_cache_matches_the_growing_cache(monkeypatch, fast_decode):
    monkeypatch.setenv("RLHFCTL_FAST_DECODE", fast_decode)
    model = tiny_model()
    preallocated = sample(model, monkeypatch, preallocated_cache)
    growing = sample(model, monkeypatch, lambda model, capacity: None)  # transformers' own DynamicCache
    assert torch.equal(preallocated[0], growing[0])
    assert torch.equal(preallocated[1], growing[1])


def test_layers_write_into_one_buffer_and_grow_past_the_announced_capacity():
    layer = PreallocatedLayer(capacity=4)
    chunks = [torch.randn(2, 3, width, 5) for width in (3, 1, 1, 2)]  # 7 positions: past the capacity of 4
    buffers = []
    for chunk in chunks:
        keys, values = layer.update(chunk, -chunk)
        buffers.append(layer._key_buffer.data_ptr())
        assert keys.data_ptr() == layer._key_buffer.data_ptr()  # a view of the buffer, not a copy
    assert buffers[0] == buffers[1]  # the second update wrote in place
    expected = torch.cat(chunks, dim=-2)
    assert torch.equal(keys, expected) and torch.equal(values, -expected)
    assert layer.get_seq_length() == 7


def test_full_attention_models_get_the_preallocated_cache_and_others_keep_their_own():
    cache = preallocated_cache(tiny_model(), capacity=20)
    assert cache is not None and all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    sliding = tiny_model(use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert preallocated_cache(sliding, capacity=20) is None
    assert preallocated_cache(torch.nn.Linear(2, 2), capacity=20) is None


def test_one_prompt_pass_fanned_out_to_n_samples_matches_repeating_the_prompts():
    model = tiny_model()
    ids, mask = prompts()
    params = SamplingParams(n=3, max_new_tokens=10, temperature=1.0)

    def run(input_ids, attention_mask, samples_per_prompt):
        return sample_responses(model, input_ids, attention_mask, params, eos_ids=[10_000], pad_id=0,
                                generator=torch.Generator().manual_seed(5), samples_per_prompt=samples_per_prompt)

    shared = run(ids, mask, 3)
    repeated = run(ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), 1)
    assert shared[0].shape == (18, 10)
    assert torch.equal(shared[0], repeated[0]) and torch.equal(shared[1], repeated[1])
    assert not torch.equal(shared[0][0], shared[0][1])  # the samples of one prompt still differ
