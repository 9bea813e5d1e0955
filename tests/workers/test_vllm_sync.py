"""The vLLM sync's weights at world 2 on gloo (FSDP2 shards), no vLLM needed: each shard is cast to the
engine's dtype before the all-gather, half the bytes of float32 masters, and the result is bit for bit the
old gather-then-cast, for tied and untied heads, with and without a LoRA adapter merged in."""

from __future__ import annotations

import copy

import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.workers.recipes import TINY_MODEL, tiny_recipe
from tests.workers.sync_workers import SyncWeightsActor


def update_batch(rows: int = 4, prompt: int = 5, response: int = 5) -> DataProto:
    """Seeded full-mask rows with advantages: one update moves every weight (and a LoRA adapter off zero)."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 60, (rows, prompt + response), generator=generator)
    return DataProto.from_dict({
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "responses": input_ids[:, prompt:].contiguous(),
        "response_mask": torch.ones(rows, response, dtype=torch.long),
        "advantages": torch.randn(rows, response, generator=generator),
    })


# Two cases cover both paths (a plain weight; a LoRA merge) and both heads: each costs a world-2 start.
@pytest.mark.parametrize(("tied", "lora"), [(False, False), (True, True)], ids=["untied", "tied-lora"])
def test_world_2_sync_casts_shards_before_the_gather_and_equals_gather_then_cast(ray_session, tied, lora):
    model = copy.deepcopy(TINY_MODEL)
    model["config"]["tie_word_embeddings"] = tied
    actor = {"model": model, "strategy": "fsdp2", "optim": {"lr": 5e-2}}
    if lora:
        actor["lora"] = {"r": 4, "alpha": 8}
    pool = RayResourcePool([2], name=f"sync-{int(tied)}{int(lora)}")
    group = None
    try:
        group = RayWorkerGroup(pool, RayClassWithInitArgs(SyncWeightsActor, tiny_recipe(roles={"actor": actor}), "actor"), role="actor")
        group.init_model()
        group.update_actor(update_batch())
        ranks = group.synced_weights("bfloat16")
    finally:
        if group is not None:
            group.shutdown()
        pool.release()
    first = ranks[0]
    assert "torch.float32" in first["masters"]
    sent = first["sent"]
    if lora:  # the adapter's delta B @ A gathers its small factor A (r rows) in float32; the weights go in 16 bits
        assert set(sent) == {"torch.bfloat16", "torch.float32"} and sent["torch.float32"] < 0.25 * sent["torch.bfloat16"]
    else:
        assert set(sent) == {"torch.bfloat16"}  # every all-gather carried 16-bit shards: half of float32's bytes
    names = list(first["cast_first"])
    assert names == list(first["cast_after"]) and ("lm_head.weight" in names) == (not tied)
    assert not any("lora_" in name or "base_layer" in name for name in names)
    for rank in ranks:
        for name in names:
            new, old = rank["cast_first"][name], rank["cast_after"][name]
            assert new.dtype == torch.bfloat16 and torch.equal(new, old), name
            assert torch.equal(new, first["cast_first"][name]), name  # both ranks send the engine the same tensor
