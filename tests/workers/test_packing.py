"""Padding-free (packed) passes equal the padded ones, and token-budget micro-batches give the same gradient."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

import rlhfctl.engine.packing as packing
from rlhfctl.algorithms import agg_loss
from rlhfctl.models.loading import CausalLMWithValueHead, enable_activation_checkpointing, load_token_value_model
from workers.critic import response_values
from rlhfctl.engine.log_probs import position_ids_from_mask, sequence_log_probs
from rlhfctl.engine.micro_batches import TokenBudgetError, split_by_tokens
from workers.sft import token_nll
from rlhfctl.engine.training import optimize_on_batch
from tests.workers.recipes import TINY_MODEL, tokenizer

PROMPT, RESPONSE = 6, 7


def tiny_config(family: str, kernel: str = "sdpa", layers: int = 2, **extra):
    config = AutoConfig.for_model(
        family, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=40, max_position_embeddings=64, pad_token_id=0, **extra,
    )
    config._attn_implementation = kernel
    return config


def rollout_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded prompts + right-padded responses of uneven lengths, one row without padding."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 40, (4, PROMPT + RESPONSE), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[1, :1] = 0
    mask[2, PROMPT + 2 :] = 0
    mask[3, PROMPT + 5 :] = 0
    ids = ids * mask  # pad id 0
    batch = {"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:],
             "response_mask": mask[:, PROMPT:]}
    batch["position_ids"] = position_ids_from_mask(mask)
    return batch


@pytest.fixture
def varlen_calls(monkeypatch):
    """Counts the packed rows the varlen sdpa kernel lays out (to see that it, not a dense mask, ran)."""
    calls = []
    original = packing._unpack
    monkeypatch.setattr(packing, "_unpack", lambda states, layout: calls.append(layout.rows) or original(states, layout))
    return calls


@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_padding_free_log_probs_and_entropies_equal_the_padded_ones(family, kernel, varlen_calls):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(family, kernel)).eval()
    batch = rollout_batch()
    valid = batch["response_mask"].bool()
    with torch.no_grad():
        padded, padded_entropy = sequence_log_probs(model, batch, temperature=0.7)
        packed, packed_entropy = sequence_log_probs(model, batch, temperature=0.7, padding_free=True)
    torch.testing.assert_close(packed[valid], padded[valid], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed_entropy[valid], padded_entropy[valid], atol=1e-5, rtol=1e-5)
    assert bool((packed[~valid] == 0).all())
    assert packing.packing_unsupported(model) is None
    assert (len(varlen_calls) > 0) == (kernel == "sdpa")  # sdpa: per-sequence layout; eager: transformers' mask
    assert all(rows == 4 for rows in varlen_calls)


def test_the_sdpa_layout_is_built_once_per_micro_batch_and_attention_reads_no_device_value(monkeypatch, varlen_calls):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("qwen2", layers=4)).eval()
    batch = rollout_batch()
    builds, fallbacks, reads = [], [], []
    build, fallback = packing._build_layout, packing._layout_of
    monkeypatch.setattr(packing, "_build_layout", lambda *args: builds.append(1) or build(*args))
    monkeypatch.setattr(packing, "_layout_of", lambda cu: fallbacks.append(1) or fallback(cu))
    packed = packing.pack_rows(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    kwargs = packing._packed_kwargs(model, packed)
    assert builds == [1]  # built here, where the packed length is known on the host
    for name in ("__int__", "item"):  # reading a device value to the host: a sync on CUDA
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, _o=original, _n=name: reads.append(_n) or _o(self))
    with torch.no_grad():
        logits = model(**kwargs).logits
    assert len(varlen_calls) == 3 * 4  # query, key and value in each of the 4 layers took the varlen path
    assert builds == [1] and fallbacks == [] and reads == []  # on one layout, no value read back
    monkeypatch.undo()
    # cu_seq_lens that _packed_kwargs did not build: today's computation from the tensor, the same outputs
    del packing._LAYOUTS[kwargs["cu_seq_lens_q"]]
    packing._layout_of.cache_clear()
    with torch.no_grad():
        rebuilt = model(**kwargs).logits
    assert packing._layout_of.cache_info().misses == 1
    torch.testing.assert_close(rebuilt, logits, atol=0, rtol=0)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_padding_free_gradients_equal_the_padded_ones(checkpointing):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("qwen2")).train()
    if checkpointing:  # recomputation replays the varlen arguments with each layer
        enable_activation_checkpointing(model)
    batch = rollout_batch(seed=1)
    grads = []
    for padding_free in (False, True):
        model.zero_grad()
        log_probs, entropy = sequence_log_probs(model, batch, padding_free=padding_free)
        (agg_loss(-log_probs - 0.1 * entropy, batch["response_mask"], "token-mean")).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-5)


def test_padding_free_values_equal_the_padded_ones():
    batch = rollout_batch(seed=2)
    valid = batch["response_mask"].bool()
    critic = load_token_value_model(TINY_MODEL, tokenizer(), seed=0).eval()
    torch.manual_seed(0)
    head_model = CausalLMWithValueHead.from_config(tiny_config("llama")).eval()  # no kwargs: transformers' mask
    for model in (critic, head_model):
        ids = batch["input_ids"].clamp(max=model.config.vocab_size - 1)
        rows = {**batch, "input_ids": ids, "responses": ids[:, PROMPT:]}
        with torch.no_grad():
            padded, packed = response_values(model, rows), response_values(model, rows, padding_free=True)
        torch.testing.assert_close(packed[valid], padded[valid], atol=1e-5, rtol=1e-5)


def test_padding_free_sft_nll_equals_the_padded_one():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("qwen2")).eval()
    ids = torch.randint(1, 40, (3, 10), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    loss_mask = mask.clone()
    loss_mask[:, :3] = 0  # the prompt part
    batch = {"input_ids": ids * mask, "attention_mask": mask, "position_ids": position_ids_from_mask(mask),
             "loss_mask": loss_mask}
    with torch.no_grad():
        nll, weight = token_nll(model, batch)
        packed_nll, packed_weight = token_nll(model, batch, padding_free=True)
    torch.testing.assert_close(packed_weight, weight)
    torch.testing.assert_close(packed_nll * packed_weight, nll * weight, atol=1e-5, rtol=1e-5)


def test_padding_free_sequence_scores_equal_the_padded_ones():
    torch.manual_seed(0)
    config = tiny_config("qwen2", num_labels=1)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    ids = torch.randint(1, 40, (3, 9), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    mask[2, 8:] = 0
    ids = ids * mask
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits[:, 0]
        packed = packing.packed_sequence_scores(model, ids, mask)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)


def test_the_default_is_on_for_tested_families_and_an_unsupported_one_names_the_key():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("qwen2"))
    assert packing.use_padding_free(None, model, "roles.actor.padding_free") is True
    assert packing.use_padding_free(False, model, "roles.actor.padding_free") is False
    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=40))
    assert packing.use_padding_free(None, gpt2, "roles.actor.padding_free") is False
    with pytest.raises(ValueError, match=r"roles\.critic\.padding_free is true, but model family 'gpt2'"):
        packing.use_padding_free(True, gpt2, "roles.critic.padding_free")


# ------------------------------------------------------------------ token-budget micro-batches


def _gradient(model, batch, agg: str, padding_free: bool, **split) -> torch.Tensor:
    """The gradient optimize_on_batch accumulates for one mini-batch (read before the optimizer step)."""
    captured = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def loss_fn(micro):
        log_probs, _ = sequence_log_probs(model, micro, with_entropy=False, padding_free=padding_free)
        return agg_loss(-log_probs * micro["advantages"], micro["response_mask"], agg), {}

    optimize_on_batch(
        batch, model=model, optimizer=optimizer, loss_fn=loss_fn, device=torch.device("cpu"), epochs=1,
        mini_batch_rows=len(batch["input_ids"]), grad_clip=None, generator=torch.Generator().manual_seed(0),
        row_tokens=batch["attention_mask"].sum(-1),
        loss_tokens=batch["response_mask"].sum(-1) if agg == "token-mean" else None,
        after_step=lambda: captured.append(torch.cat([p.grad.flatten() for p in model.parameters()])), **split,
    )
    return captured[0]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_token_budget_and_ragged_micro_batches_give_the_whole_mini_batch_gradient(agg):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("qwen2")).train()
    batch = {**rollout_batch(seed=5)}
    batch["advantages"] = torch.linspace(-1.0, 1.0, 4)[:, None].expand(4, RESPONSE).contiguous()
    whole = _gradient(model, batch, agg, padding_free=False, micro_batch_rows=None)
    lengths = batch["attention_mask"].sum(-1).tolist()  # [10, 12, 8, 11]
    for padding_free in (False, True):
        budget = _gradient(model, batch, agg, padding_free, micro_batch_rows=None, micro_batch_tokens=max(lengths) + 1)
        ragged = _gradient(model, batch, agg, padding_free, micro_batch_rows=3)  # pieces of 3 and 1 rows
        torch.testing.assert_close(budget, whole, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ragged, whole, atol=1e-5, rtol=1e-5)


def test_token_budget_packs_longest_first_within_the_budget():
    lengths = torch.tensor([5, 9, 3, 7, 2, 6])
    pieces = split_by_tokens(torch.arange(6), lengths, 12, key="roles.actor.micro_batch_tokens", device=torch.device("cpu"))
    assert sorted(int(i) for piece in pieces for i in piece) == list(range(6))
    assert all(int(lengths[piece].sum()) <= 12 for piece in pieces)
    assert len(pieces) == 3  # 32 tokens need at least 3 micro-batches of 12
    with pytest.raises(TokenBudgetError, match=r"roles\.actor\.micro_batch_tokens=8 is smaller than one sequence \(9 tokens\)"):
        split_by_tokens(torch.arange(6), lengths, 8, key="roles.actor.micro_batch_tokens", device=torch.device("cpu"))
