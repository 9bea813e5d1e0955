"""Partial rollouts on the hf engine: a sample generated in budgeted segments, each continued from its prefix, has the
tokens and log-probs of one generated in a single call under the same weights, and carries each token's version."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlhfctl.models.loading import load_causal_lm
from rlhfctl.rollout.generator import Generator
from rlhfctl.rollout.partial_buffer import PartialBuffer, training_batch
from tests.workers.recipes import TINY_MODEL, digits_prompts
from tests.workers.recipes import tokenizer as char_tokenizer

MAX_NEW = 14
ROLLOUT = {"n": 1, "max_new_tokens": MAX_NEW, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "do_sample": False}


def generator_for(model: Any, tok: Any, colocated: bool) -> Generator:
    generator = Generator(ROLLOUT, role="actor", seed=0, rank=0, colocated=colocated)
    generator.bind(model, tok, torch.device("cpu"))
    return generator


def call(generator: Generator, prompts: Any) -> Any:
    return generator.generate(prompts, generator.sampling_params(prompts.meta_info), (0, 0, "test"))


@pytest.fixture(scope="module")
def tok() -> Any:
    return char_tokenizer()


@pytest.fixture(scope="module")
def model(tok) -> Any:
    """The tiny model with its EOS made the greedy choice wherever one of its sampled tokens was: the first such token
    whose samples then end at several lengths, some before the full width and some at it."""
    model = load_causal_lm(TINY_MODEL, tok, seed=0).eval()
    head = model.get_output_embeddings().weight
    original = head[tok.eos_token_id].detach().clone()
    whole = call(generator_for(model, tok, colocated=False), digits_prompts(8, seed=3))
    for token in sorted(set(whole.batch["responses"].flatten().tolist())):
        with torch.no_grad():
            head[tok.eos_token_id] = head[token] * 1.05
        lengths = call(generator_for(model, tok, colocated=False), digits_prompts(8, seed=3)).batch["response_mask"].sum(-1)
        if len(set(lengths.tolist())) >= 3 and int(lengths.min()) < MAX_NEW and int(lengths.max()) == MAX_NEW:
            return model
        with torch.no_grad():
            head[tok.eos_token_id] = original
    raise AssertionError("no token of the tiny model's samples gives varied lengths")


@pytest.mark.parametrize("colocated", [True, False], ids=["colocated", "rollout-group"])
def test_segments_continued_from_their_prefix_equal_one_uninterrupted_generation(tok, model, colocated):
    prompts = digits_prompts(8, seed=3)
    whole = call(generator_for(model, tok, colocated=False), prompts)
    lengths = whole.batch["response_mask"].sum(-1).tolist()
    assert min(lengths) < MAX_NEW and max(lengths) == MAX_NEW  # some end early, some run the full width

    buffer = PartialBuffer(n=1, max_new_tokens=MAX_NEW, budget=4, max_staleness=10)
    buffer.add(prompts)
    generator, version, widths = generator_for(model, tok, colocated), 0, []
    while buffer.unfinished():
        segment = buffer.segment()
        widths.append(segment.meta_info["max_new_tokens"])
        buffer.take(call(generator, segment), version)
        version += 1
    assert widths == [4, 4, 4, 2]  # the last segment asks only for the room left
    groups = buffer.complete()
    batch = training_batch(groups, tok, MAX_NEW, 1.0, tok.pad_token_id)
    assert torch.equal(batch.batch["responses"], whole.batch["responses"])
    assert torch.equal(batch.batch["response_mask"], whole.batch["response_mask"])
    assert torch.allclose(batch.batch["rollout_log_probs"], whole.batch["rollout_log_probs"], atol=1e-5, rtol=0)
    assert batch.non_tensor_batch["ground_truth"].tolist() == prompts.non_tensor_batch["ground_truth"].tolist()
    # each token carries the version of the segment that sampled it: positions 0-3 version 0, 4-7 version 1, ...
    mask = batch.batch["response_mask"].bool()
    expected = (torch.arange(MAX_NEW) // 4).expand_as(mask)
    assert torch.equal(batch.batch["token_versions"][mask], expected[mask])
    assert batch.batch["partial_segments"].tolist() == [(length + 3) // 4 for length in lengths]
    assert batch.batch["policy_version"].tolist() == [0] * 8
