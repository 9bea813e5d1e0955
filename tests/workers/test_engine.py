"""The training engine (rlhfctl/engine/placement.py) on real Ray ranks with gloo: FSDP2 against DDP against one rank,
float32 master weights under bf16 compute, sharded checkpoints that reshard, LoRA under FSDP2, and the
Hugging Face directory every checkpoint carries."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfctl.protocol import DataProto
from tests.workers.conftest import local_group, ray_role_group
from tests.workers.recipes import tiny_recipe
from workers import ActorWorker

PROMPT, RESPONSE, ROWS = 6, 6, 8


def fixed_batch(seed: int = 0) -> DataProto:
    """Rows with full masks (every rank holds as many tokens), seeded ids and advantages."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(5, 60, (ROWS, PROMPT), generator=generator)
    responses = torch.randint(5, 60, (ROWS, RESPONSE), generator=generator)
    input_ids = torch.cat([prompts, responses], dim=1)
    return DataProto.from_dict({
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "position_ids": torch.arange(PROMPT + RESPONSE).expand(ROWS, -1).contiguous(),
        "responses": responses,
        "response_mask": torch.ones_like(responses),
        "advantages": torch.randn(ROWS, RESPONSE, generator=generator),
    })


def off_policy(batch: DataProto, log_probs: torch.Tensor) -> DataProto:
    """The batch with old log-probs a little away from the current ones, so the ratio (and the loss) moves."""
    noise = 0.05 * torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(7))
    return batch.union(DataProto.from_dict({"old_log_probs": log_probs + noise}))


def engine_recipe(**actor):
    return tiny_recipe(roles={"actor": actor})


def ray_group(recipe, name: str, world: int = 2):
    """A group of ``world`` actor ranks (see ``ray_role_group``)."""
    return ray_role_group(ActorWorker, recipe, "actor", name, world)


def total_state(sizes: dict[str, int]) -> int:
    return sizes["params"] + sizes["grads"] + sizes["optimizer"]


@pytest.mark.slow
def test_fsdp2_ddp_and_one_rank_agree_and_fsdp2_halves_the_state(ray_session, tmp_path):
    batch = fixed_batch()
    with local_group(ActorWorker, engine_recipe(), "actor") as single:
        batch = off_policy(batch, single.compute_log_prob(batch).batch["old_log_probs"])
        (expected,) = single.update_actor(batch)
    results, sizes = {}, {}
    for strategy in ("fsdp2", "ddp"):
        with ray_group(engine_recipe(strategy=strategy), f"engine-{strategy}") as group:
            results[strategy] = group.update_actor(batch)
            sizes[strategy] = group.state_bytes()
            if strategy == "fsdp2":
                checkpoint = Path(group.save_checkpoint(str(tmp_path))[0])
                log_probs = group.compute_log_prob(batch).batch["old_log_probs"]
    for strategy, ranks in results.items():
        for metrics in ranks:
            for key in ("actor/pg_loss", "actor/grad_norm"):
                assert metrics[key] == pytest.approx(expected[key], rel=1e-5), (strategy, key)
    # Memory: each FSDP2 rank holds about half of what a DDP replica holds (params + grads + optimizer).
    assert max(total_state(s) for s in sizes["fsdp2"]) <= 0.6 * min(total_state(s) for s in sizes["ddp"])

    # The checkpoint's HF directory loads without rlhfctl and reproduces the run's log-probs.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint / "hf").eval()
    assert {"config.json", "model.safetensors", "generation_config.json"} <= {p.name for p in (checkpoint / "hf").iterdir()}
    with torch.no_grad():
        logits = model(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"]).logits
    direct = torch.log_softmax(logits[:, PROMPT - 1 : -1].float(), -1).gather(-1, batch.batch["responses"][..., None]).squeeze(-1)
    torch.testing.assert_close(direct, log_probs, atol=1e-5, rtol=1e-5)

    # Resharding 2 -> 1: the world-2 FSDP2 checkpoint loads into one unsharded rank, weights and optimizer.
    with local_group(ActorWorker, engine_recipe(), "actor") as resumed:
        resumed.load_checkpoint(str(tmp_path))
        torch.testing.assert_close(resumed.compute_log_prob(batch).batch["old_log_probs"], log_probs, atol=1e-5, rtol=1e-5)
        assert resumed.workers[0].optimizer.state  # the AdamW moments came back too
        resumed.save_checkpoint(str(tmp_path / "one"))
    # ... and 1 -> 2: a one-rank checkpoint loads into FSDP2 shards on two ranks.
    with ray_group(engine_recipe(strategy="fsdp2"), "engine-back") as group:
        group.load_checkpoint(str(tmp_path / "one"))
        torch.testing.assert_close(group.compute_log_prob(batch).batch["old_log_probs"], log_probs, atol=1e-5, rtol=1e-5)


def changed_share(before: Path, after: Path) -> float:
    old, new = load_file(str(before / "model.safetensors")), load_file(str(after / "model.safetensors"))
    changed = sum(int((old[key] != new[key]).sum()) for key in old)
    return changed / sum(tensor.numel() for tensor in old.values())


def test_bf16_compute_keeps_float32_master_weights_that_move_at_lr_1e6(tmp_path):
    recipe = engine_recipe(model={"dtype": "bfloat16"}, optim={"lr": 1e-6})
    recipe["trainer"]["export_dtype"] = "float32"  # export the masters themselves, not their bf16 rounding
    with local_group(ActorWorker, recipe, "actor") as actor:
        worker = actor.workers[0]
        assert all(p.dtype == torch.float32 for p in worker.module.parameters())
        batch = fixed_batch()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            assert worker.model(input_ids=batch.batch["input_ids"][:1]).logits.dtype == torch.bfloat16
        actor.export_hf(str(tmp_path / "before"))
        for step in range(3):
            actor.update_actor(fixed_batch(step))
        actor.export_hf(str(tmp_path / "after"))
        state = worker.optimizer.state[next(iter(worker.module.parameters()))]
        assert state["exp_avg"].dtype == torch.float32
    # Pure bf16 AdamW changed 2.3% of the elements here; float32 masters change most of them.
    assert changed_share(tmp_path / "before", tmp_path / "after") > 0.5


@pytest.mark.slow
def test_fsdp2_bf16_and_lora_under_fsdp2(ray_session, tmp_path):
    from transformers import AutoModelForCausalLM

    recipe = engine_recipe(strategy="fsdp2", model={"dtype": "bfloat16"}, optim={"lr": 1e-6})
    recipe["trainer"]["export_dtype"] = "float32"  # export the masters themselves, not their bf16 rounding
    with ray_group(recipe, "engine-bf16") as group:
        group.export_hf(str(tmp_path / "before"))
        group.update_actor(fixed_batch())
        assert group.export_hf(str(tmp_path / "after")) == str(tmp_path / "after")
    assert changed_share(tmp_path / "before", tmp_path / "after") > 0.5

    lora = engine_recipe(strategy="fsdp2", lora={"r": 4, "alpha": 8}, optim={"lr": 5e-2})
    batch = fixed_batch()
    with ray_group(lora, "engine-lora") as group:
        before = group.state_fingerprint()
        reference = group.compute_ref_log_prob(batch).batch["ref_log_prob"]
        group.update_actor(batch)
        assert group.state_fingerprint()[0] != before[0]
        policy = group.compute_log_prob(batch).batch["old_log_probs"]
        assert not torch.allclose(policy, reference, atol=1e-4)  # the adapter moved; the base did not
        torch.testing.assert_close(group.compute_ref_log_prob(batch).batch["ref_log_prob"], reference)
        checkpoint = Path(group.save_checkpoint(str(tmp_path / "lora"))[0])
        group.update_actor(fixed_batch(1))
        group.load_checkpoint(str(tmp_path / "lora"))
        torch.testing.assert_close(group.compute_log_prob(batch).batch["old_log_probs"], policy)
    assert (checkpoint / "adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(checkpoint / "hf").eval()
    with torch.no_grad():
        logits = merged(input_ids=batch.batch["input_ids"]).logits
    direct = torch.log_softmax(logits[:, PROMPT - 1 : -1].float(), -1).gather(-1, batch.batch["responses"][..., None]).squeeze(-1)
    torch.testing.assert_close(direct, policy, atol=1e-5, rtol=1e-5)


def test_fsdp2_at_world_1_with_activation_checkpointing_and_offload_matches_the_plain_module():
    batch = fixed_batch()
    results = {}
    # World 1: a plain module, and FSDP2 on a one-rank group (the local backend), also with CPU offload.
    for name, strategy, offload in (("ddp", "ddp", False), ("fsdp2", "fsdp2", False), ("offload", "fsdp2", True)):
        recipe = engine_recipe(strategy=strategy, model={"gradient_checkpointing": True}, fsdp={"cpu_offload": offload})
        with local_group(ActorWorker, recipe, "actor") as actor:
            old = actor.compute_log_prob(batch).batch["old_log_probs"]
            results[name] = (old, actor.update_actor(off_policy(batch, old))[0])
    for name in ("fsdp2", "offload"):
        torch.testing.assert_close(results[name][0], results["ddp"][0], atol=1e-5, rtol=1e-5)
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert results[name][1][key] == pytest.approx(results["ddp"][1][key], rel=1e-5), (name, key)
