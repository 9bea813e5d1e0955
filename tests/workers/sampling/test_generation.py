"""generate_sequences: shapes, masks after EOS, n consecutive samples, carried columns, determinism."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from rlhfctl.models.loading import load_causal_lm
from tests.workers.conftest import local_group
from tests.workers.recipes import TINY_MODEL, digits_prompts, tiny_recipe, tokenizer
from workers import ActorWorker
from rlhfctl.rollout.generation import SamplingParams, filter_logits, sample_responses

EOS, PAD = 1, 0


def check_rollout(out, prompts, n: int, max_new_tokens: int) -> None:
    """Every structural promise of the rollout DataProto."""
    rows = len(prompts) * n
    prompt_width = prompts.batch["input_ids"].shape[1]
    batch = out.batch
    assert len(out) == rows
    assert batch["responses"].shape == (rows, max_new_tokens)
    assert batch["response_mask"].shape == (rows, max_new_tokens)
    assert batch["prompts"].shape == (rows, prompt_width)
    assert torch.equal(batch["prompts"], prompts.batch["input_ids"].repeat_interleave(n, dim=0))
    assert torch.equal(batch["input_ids"], torch.cat([batch["prompts"], batch["responses"]], dim=1))
    prompt_mask = prompts.batch["attention_mask"].repeat_interleave(n, dim=0)
    assert torch.equal(batch["attention_mask"], torch.cat([prompt_mask, batch["response_mask"]], dim=1))
    expected_positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    assert torch.equal(batch["position_ids"], expected_positions)
    decode = tokenizer().decode
    for row in range(rows):
        mask = batch["response_mask"][row]
        tokens = batch["responses"][row]
        length = int(mask.sum())
        assert length >= 1
        assert mask[:length].eq(1).all() and mask[length:].eq(0).all()  # ones, then zeros
        assert not tokens[: length - 1].eq(EOS).any()  # no EOS before the last valid token
        if length < max_new_tokens:
            assert tokens[length - 1] == EOS  # stopped at the first EOS...
            assert tokens[length:].eq(PAD).all()  # ...and padded after it
        assert out.non_tensor_batch["response_text"][row] == decode(tokens[:length].tolist(), skip_special_tokens=True)


def test_rollout_shapes_masks_and_carried_columns(actor_group):
    prompts = digits_prompts(3)
    out = actor_group.generate_sequences(prompts)
    check_rollout(out, prompts, n=2, max_new_tokens=8)
    columns = out.non_tensor_batch
    # n samples of a prompt are consecutive, in input order, with its columns repeated.
    assert list(columns["uid"]) == ["p0", "p0", "p1", "p1", "p2", "p2"]
    assert list(columns["ground_truth"]) == list(np.repeat(prompts.non_tensor_batch["ground_truth"], 2))
    assert list(columns["prompt_text"]) == list(np.repeat(prompts.non_tensor_batch["prompt_text"], 2))
    assert out.meta_info["temperature"] == 1.0


def test_meta_info_overrides_and_eos_handling(actor_group):
    # Near-uniform random model over 100 tokens: 256 sampled tokens surely hit EOS somewhere.
    prompts = digits_prompts(8, seed=3, n=4, max_new_tokens=24)
    out = actor_group.generate_sequences(prompts)
    check_rollout(out, prompts, n=4, max_new_tokens=24)
    lengths = out.batch["response_mask"].sum(-1)
    assert (lengths < 24).any(), "expected at least one response to end with EOS"


def test_greedy_is_deterministic_and_matches_uncached_decoding(actor_group):
    prompts = digits_prompts(3, do_sample=False, n=1)
    first = actor_group.generate_sequences(prompts)
    second = actor_group.generate_sequences(prompts)
    assert len(first) == 3
    assert torch.equal(first.batch["responses"], second.batch["responses"])
    # Same tokens as a plain greedy loop with full forward passes (no KV cache).
    model = load_causal_lm(TINY_MODEL, tokenizer(), seed=0).eval()
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    with torch.no_grad():
        for _ in range(8):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            nxt = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1].argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(nxt)[:, None]], dim=1)
    greedy = ids[:, prompts.batch["input_ids"].shape[1] :]
    valid = first.batch["response_mask"].bool()
    assert torch.equal(first.batch["responses"][valid], greedy[valid])


def test_sampling_is_reproducible_from_the_seed_and_varies_per_call():
    recipe = tiny_recipe()
    prompts = digits_prompts(2)
    with local_group(ActorWorker, recipe, "actor") as a, local_group(ActorWorker, recipe, "actor") as b:
        first_a, first_b = a.generate_sequences(prompts), b.generate_sequences(prompts)
        assert torch.equal(first_a.batch["responses"], first_b.batch["responses"])
        second_a = a.generate_sequences(prompts)
        assert not torch.equal(first_a.batch["responses"], second_a.batch["responses"])


class ScriptedLM(nn.Module):
    """Emits token 5 until row r has produced r + 1 tokens, then EOS; counts forward calls."""

    def __init__(self, prompt_width: int) -> None:
        super().__init__()
        self.prompt_width = prompt_width
        self.calls = 0

    def forward(self, input_ids, attention_mask, position_ids, cache=None, use_cache=False, logits_to_keep=0):
        self.calls += 1
        rows = input_ids.shape[0]
        generated = attention_mask.shape[1] - self.prompt_width  # tokens produced so far
        logits = torch.zeros(rows, 1, 10)
        for row in range(rows):
            logits[row, 0, EOS if generated >= row + 1 else 5] = 10.0
        return SimpleNamespace(logits=logits, cache=("kv", attention_mask.shape[1]))


def test_sampling_loop_stops_when_all_rows_ended_and_pads_after_eos():
    prompts = torch.tensor([[0, 7, 8], [9, 7, 8]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    model = ScriptedLM(prompt_width=3)
    params = SamplingParams(n=1, max_new_tokens=6, do_sample=False)
    responses, response_mask = sample_responses(model, prompts, mask, params, eos_ids=[EOS], pad_id=PAD)
    assert responses.tolist() == [[5, 1, 0, 0, 0, 0], [5, 5, 1, 0, 0, 0]]
    assert response_mask.tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]
    assert model.calls == 3  # the prompt pass plus two decoding steps: stopped early


def test_top_k_and_top_p_filtering():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept_k = torch.isfinite(filter_logits(logits, 1.0, top_k=2, top_p=1.0))
    assert kept_k.tolist() == [[True, True, False, False]]
    kept_p = torch.isfinite(filter_logits(logits, 1.0, top_k=0, top_p=0.8))
    assert kept_p.tolist() == [[True, True, False, False]]
    kept_p = torch.isfinite(filter_logits(logits, 1.0, top_k=0, top_p=0.81))
    assert kept_p.tolist() == [[True, True, True, False]]
