"""One prompt pass per distinct prompt: the same log-probs and gradients as the row-by-row pass."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlhfctl.models.loading import load_causal_lm
from tests.workers.recipes import TINY_MODEL, tokenizer
from rlhfctl.rollout import prompt_sharing
from rlhfctl.engine.log_probs import position_ids_from_mask, sequence_log_probs
from rlhfctl.rollout.prompt_sharing import SHARED_PROMPT_ENV, distinct_prompt_rows
from rlhfctl.engine.training import enable_activation_checkpointing


def tiny_model(**config_overrides):
    model_cfg = {**TINY_MODEL, "config": {**TINY_MODEL["config"], **config_overrides}}
    return load_causal_lm(model_cfg, tokenizer(), seed=0)


def grouped_batch(prompts=4, samples=3, prompt_width=6, response_width=5, seed=0):
    """``prompts`` left-padded prompts with ``samples`` responses each, rows shuffled (as mini-batches are)."""
    generator = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(5, 60, (prompts, prompt_width), generator=generator)
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[0, :3] = 0
    prompt_mask[1, :1] = 0
    prompt_ids = prompt_ids.masked_fill(prompt_mask == 0, 0)
    rows = prompts * samples
    responses = torch.randint(5, 60, (rows, response_width), generator=generator)
    response_mask = torch.ones_like(responses)
    response_mask[2, 3:] = 0  # one response ended early
    order = torch.randperm(rows, generator=generator)
    input_ids = torch.cat([prompt_ids.repeat_interleave(samples, 0), responses], dim=1)[order]
    attention_mask = torch.cat([prompt_mask.repeat_interleave(samples, 0), response_mask], dim=1)[order]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "responses": responses[order],
            "position_ids": position_ids_from_mask(attention_mask)}


def count_forward_rows(model):
    """Record the batch size of every top-level forward call."""
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[0]),
                                    with_kwargs=True)
    return seen


def log_probs_and_grads(model, batch):
    model.zero_grad()
    log_probs, entropy = sequence_log_probs(model, batch, temperature=0.7, with_entropy=True)
    (log_probs * batch["attention_mask"][:, -log_probs.shape[1]:]).sum().backward()
    return log_probs.detach(), entropy.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_distinct_prompt_rows_name_one_row_per_prompt_and_map_every_row_to_it():
    ids = torch.tensor([[1, 2], [3, 4], [1, 2], [0, 2], [3, 4]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [0, 1], [1, 1]])
    first, inverse = distinct_prompt_rows(ids, mask)
    assert len(first) == 3 and sorted(first.tolist()) == [0, 1, 3]  # the first row of each prompt
    assert torch.equal(ids[first][inverse], ids) and torch.equal(mask[first][inverse], mask)
    # The same token ids under a different mask are a different prompt.
    first, _ = distinct_prompt_rows(torch.tensor([[0, 2], [0, 2]]), torch.tensor([[0, 1], [1, 1]]))
    assert len(first) == 2


def test_shared_pass_gives_the_same_log_probs_entropies_and_gradients(monkeypatch):
    model = tiny_model().train()
    batch = grouped_batch()
    monkeypatch.setenv(SHARED_PROMPT_ENV, "1")
    calls = count_forward_rows(model)
    shared = log_probs_and_grads(model, batch)
    assert calls == [4, 12]  # one pass over the 4 distinct prompts, one over the 12 responses
    monkeypatch.setenv(SHARED_PROMPT_ENV, "0")
    calls.clear()
    plain = log_probs_and_grads(model, batch)
    assert calls == [12]
    torch.testing.assert_close(shared[0], plain[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared[1], plain[1], rtol=1e-5, atol=1e-5)
    for name, grad in plain[2].items():
        torch.testing.assert_close(shared[2][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_auto_mode_shares_only_when_the_saved_work_pays(monkeypatch):
    model = tiny_model().eval()
    batch = grouped_batch()
    monkeypatch.delenv(SHARED_PROMPT_ENV, raising=False)
    calls = count_forward_rows(model)
    with torch.no_grad():
        sequence_log_probs(model, batch, with_entropy=False)  # hidden 32: 8 rows x 6 positions saved, too little
        assert calls == [12]
        monkeypatch.setattr(prompt_sharing, "MIN_SAVED_WORK", 8 * 6 * 32 * 32)
        sequence_log_probs(model, batch, with_entropy=False)
        assert calls == [12, 4, 12]
        calls.clear()
        unique = grouped_batch(prompts=12, samples=1)  # no prompt repeats: nothing to share
        sequence_log_probs(model, unique, with_entropy=False)
        assert calls == [12]


def test_beside_a_padding_free_pass_short_responses_in_a_wide_batch_go_packed(monkeypatch):
    """The shared pass runs every row at the full response width; packed, only the real tokens run. Responses of 2
    real tokens in 40 columns: packing has fewer positions, so it wins; with the whole width real, sharing does."""
    model = tiny_model().eval()
    monkeypatch.setenv(SHARED_PROMPT_ENV, "1")
    short = grouped_batch(response_width=40)
    width = short["input_ids"].shape[1]
    short["attention_mask"][:, width - 38:] = 0  # every response: 2 real tokens, then padding
    short["position_ids"] = position_ids_from_mask(short["attention_mask"])
    calls = count_forward_rows(model)
    with torch.no_grad():
        packed = sequence_log_probs(model, short, with_entropy=False, padding_free=True, chunk_tokens=0)[0]
        assert calls == [1]  # one packed row
        calls.clear()
        plain = sequence_log_probs(model, short, with_entropy=False, padding_free=False, chunk_tokens=0)[0]
        assert calls == [4, 12]  # without packing, the shared pass still pays
        real = short["attention_mask"][:, -40:].bool() & short["attention_mask"][:, -41:-1].bool()
        torch.testing.assert_close(packed[real], plain[real], rtol=1e-5, atol=1e-5)
        calls.clear()
        long_prompts = grouped_batch(prompt_width=16, response_width=40)
        sequence_log_probs(model, long_prompts, with_entropy=False, padding_free=True, chunk_tokens=0)
        assert calls == [4, 12]  # full-width responses: sharing the prompts runs fewer positions


def test_gradient_checkpointing_sliding_windows_and_other_kernels_keep_the_plain_pass(monkeypatch):
    monkeypatch.setenv(SHARED_PROMPT_ENV, "1")
    batch = grouped_batch()
    checkpointed = tiny_model()
    enable_activation_checkpointing(checkpointed)
    checkpointed.train()
    calls = count_forward_rows(checkpointed)
    sequence_log_probs(checkpointed, batch, with_entropy=False)
    assert calls == [12]
    sliding = tiny_model(use_sliding_window=True, sliding_window=4, max_window_layers=0).eval()
    calls = count_forward_rows(sliding)
    with torch.no_grad():
        sequence_log_probs(sliding, batch, with_entropy=False)
    assert calls == [12]
    flex = tiny_model().eval()
    flex.config._attn_implementation = "flex_attention"  # asked directly: running flex would compile
    assert prompt_sharing.shared_prompt_logits(flex, batch, batch["position_ids"]) is None
    assert prompt_sharing.shared_prompt_logits(tiny_model().eval(), batch, batch["position_ids"]) is not None


def _ddp_rank(rank: int, init_file: str, results: dict) -> None:
    import os

    os.environ[SHARED_PROMPT_ENV] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        model = tiny_model().train()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        batch = grouped_batch(seed=1)
        mine = {key: value[rank * 6:(rank + 1) * 6] for key, value in batch.items()}
        log_probs, _ = sequence_log_probs(ddp, mine, with_entropy=False)
        log_probs.sum().backward()  # DDP averages the two ranks' gradients
        results[rank] = {name: p.grad.clone() for name, p in model.named_parameters()}
    finally:
        dist.destroy_process_group()


def test_shared_pass_under_ddp_reduces_the_same_gradients_as_one_process(tmp_path):
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_ddp_rank, args=(str(tmp_path / "rendezvous"), results), nprocs=2, join=True)
    model = tiny_model().train()
    batch = grouped_batch(seed=1)
    for half in (slice(0, 6), slice(6, 12)):  # the plain pass over each rank's rows, gradients summed
        log_probs, _ = sequence_log_probs(model, {key: value[half] for key, value in batch.items()},
                                          with_entropy=False)
        log_probs.sum().backward()
    for name, param in model.named_parameters():
        expected = param.grad / 2
        torch.testing.assert_close(results[0][name], expected, rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(results[1][name], expected, rtol=1e-4, atol=1e-6, msg=name)
