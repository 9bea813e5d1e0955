"""The output layer scored in token chunks gives the log-probs, entropies and gradients of the full-logits pass."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

import rlhfctl.engine.forward as forward
from tests.workers.test_packing import PROMPT, RESPONSE, rollout_batch, tiny_config
from rlhfctl.engine.placement import EngineSettings, serving, shard_model
from rlhfctl.engine.log_probs import LOGITS_CHUNK_TOKENS, sequence_log_probs
from rlhfctl.rollout.prompt_sharing import SHARED_PROMPT_ENV

CHUNK = 5  # does not divide the scored token counts below (28 padded, 21 packed)
ATOL = RTOL = 1e-5


def tiny_model(family: str = "qwen2") -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(family))


@pytest.fixture
def chunk_sizes(monkeypatch):
    """The number of tokens of every logits chunk the head scores."""
    sizes = []
    original = forward.token_log_probs
    monkeypatch.setattr(forward, "token_log_probs", lambda logits, *a, **k: sizes.append(logits.shape[0]) or original(logits, *a, **k))
    return sizes


def loss_and_grads(model, batch, **options):
    """Log-probs, entropies and the gradients of a loss that uses both."""
    model.zero_grad()
    log_probs, entropy = sequence_log_probs(model, batch, temperature=0.7, **options)
    mask = batch["response_mask"]
    ((log_probs * mask).sum() - 0.1 * (entropy * mask).sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return log_probs.detach(), entropy.detach(), grads


def assert_same(chunked, full, mask):
    valid = mask.bool()
    for got, want in zip(chunked[:2], full[:2]):
        torch.testing.assert_close(got[valid], want[valid], atol=ATOL, rtol=RTOL)
    if len(chunked) > 2:
        assert chunked[2].keys() == full[2].keys() and len(full[2]) > 0
        for name, grad in full[2].items():
            torch.testing.assert_close(chunked[2][name], grad, atol=ATOL, rtol=RTOL, msg=name)


@pytest.mark.parametrize("padding_free", [False, True])
def test_chunks_give_the_full_logits_log_probs_and_entropies_without_grad(padding_free, chunk_sizes):
    model, batch = tiny_model().eval(), rollout_batch()
    with torch.no_grad():
        full = sequence_log_probs(model, batch, temperature=0.7, padding_free=padding_free, chunk_tokens=0)
        assert chunk_sizes == []  # the full pass scores the model's logits, not the head's chunks
        chunked = sequence_log_probs(model, batch, temperature=0.7, padding_free=padding_free, chunk_tokens=CHUNK)
    previous_real = batch["attention_mask"][:, PROMPT - 1 : -1].bool()
    scored = int((previous_real & batch["response_mask"].bool()).sum()) if padding_free else 4 * RESPONSE
    assert chunk_sizes == [CHUNK] * (scored // CHUNK) + [scored % CHUNK]
    assert_same(chunked, full, batch["response_mask"])
    assert LOGITS_CHUNK_TOKENS > 0


@pytest.mark.parametrize("padding_free", [False, True])
def test_chunks_give_the_full_logits_gradients(padding_free, chunk_sizes):
    model, batch = tiny_model().train(), rollout_batch(seed=1)
    full = loss_and_grads(model, batch, padding_free=padding_free, chunk_tokens=0)
    chunk_sizes.clear()
    chunked = loss_and_grads(model, batch, padding_free=padding_free, chunk_tokens=CHUNK)
    assert max(chunk_sizes) == CHUNK  # forward chunks, then each recomputed once in backward
    assert_same(chunked, full, batch["response_mask"])


def test_an_entropy_without_grad_adds_no_gradient():
    model, batch = tiny_model().train(), rollout_batch(seed=2)
    grads = []
    for chunk in (0, CHUNK):
        model.zero_grad()
        log_probs, entropy = sequence_log_probs(model, batch, entropy_grad=False, chunk_tokens=chunk)
        (log_probs.sum() + entropy.sum()).backward()
        grads.append(model.lm_head.weight.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], atol=ATOL, rtol=RTOL)


def test_a_lora_model_scores_through_its_adapted_head():
    model = tiny_model()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False)
    model = get_peft_model(model, config).train()
    assert type(forward.output_layer(model)).__module__.startswith("peft")
    for padding_free in (False, True):
        batch = rollout_batch(seed=3)
        full = loss_and_grads(model, batch, padding_free=padding_free, chunk_tokens=0)
        chunked = loss_and_grads(model, batch, padding_free=padding_free, chunk_tokens=CHUNK)
        assert any("lm_head.lora_B" in name for name in full[2])
        assert_same(chunked, full, batch["response_mask"])


def test_the_shared_prompt_pass_scores_in_chunks_too(monkeypatch):
    from tests.workers.sampling.test_prompt_sharing import count_forward_rows, grouped_batch
    from tests.workers.sampling.test_prompt_sharing import tiny_model as shared_model

    monkeypatch.setenv(SHARED_PROMPT_ENV, "1")
    batch = grouped_batch()
    batch["response_mask"] = batch["attention_mask"][:, -batch["responses"].shape[1] :]
    model = shared_model().train()
    calls = count_forward_rows(model)
    chunked = loss_and_grads(model, batch, chunk_tokens=CHUNK)
    assert calls == [4, 12]  # the shared pass: 4 distinct prompts, then the 12 rows' responses
    monkeypatch.setenv(SHARED_PROMPT_ENV, "0")
    full = loss_and_grads(model, batch, chunk_tokens=0)
    assert_same(chunked, full, batch["response_mask"])


def test_a_model_without_a_scoring_head_keeps_the_full_logits_pass(chunk_sizes):
    config = AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=40, n_positions=64,
                                  bos_token_id=1, eos_token_id=1)
    torch.manual_seed(0)
    model, batch = AutoModelForCausalLM.from_config(config).eval(), rollout_batch()
    assert forward.output_layer(model) is None
    with torch.no_grad():
        log_probs, _ = sequence_log_probs(model, batch, chunk_tokens=CHUNK)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, -8:-1]
    assert chunk_sizes == []  # the head scored nothing: the model's own logits were read
    expected = torch.log_softmax(logits, -1).gather(-1, batch["responses"][..., None]).squeeze(-1)
    torch.testing.assert_close(log_probs, expected, atol=ATOL, rtol=RTOL)


def test_fsdp2_and_ddp_at_world_1_score_in_chunks_like_the_plain_module():
    plain, batch = tiny_model().train(), rollout_batch(seed=4)
    full = loss_and_grads(plain, batch, padding_free=True, chunk_tokens=0)
    started = not dist.is_initialized()
    sharded = shard_model(copy.deepcopy(plain), EngineSettings("fsdp2", torch.float32, trainable=True), torch.device("cpu"))
    try:
        for padding_free in (False, True):
            reference = loss_and_grads(plain, batch, padding_free=padding_free, chunk_tokens=0)
            chunked = loss_and_grads(sharded, batch, padding_free=padding_free, chunk_tokens=CHUNK)
            chunked[2].update({name: grad.full_tensor() for name, grad in chunked[2].items()})
            assert_same(chunked, reference, batch["response_mask"])
        with torch.no_grad(), serving(sharded, EngineSettings("fsdp2", torch.float32, trainable=True)):
            served = sequence_log_probs(sharded, batch, temperature=0.7, padding_free=True, chunk_tokens=CHUNK)
        assert_same(served, full, batch["response_mask"])
        ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(plain))
        chunked = loss_and_grads(ddp, batch, padding_free=True, chunk_tokens=CHUNK)
        grads = {name.removeprefix("module."): grad for name, grad in chunked[2].items()}
        assert_same((*chunked[:2], grads), full, batch["response_mask"])
    finally:
        if started:
            dist.destroy_process_group()
