"""Offload between phases (rlhfctl/engine/offload.py, ``roles.<role>.fsdp.param_offload`` / ``optimizer_offload``):
the moves copy the FSDP2 shards and AdamW moments into fresh storage with equal values, wrap every role
call, and leave the training numbers exactly as without offload (real Ray, world 2, gloo)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from rlhfctl.models.loading import load_causal_lm
from tests.workers.recipes import TINY_MODEL, tiny_recipe, tokenizer
from tests.workers.scoring_workers import PlacedReference, ScoringActor, storage_places
from tests.workers.test_engine import fixed_batch, off_policy
from tests.workers.test_scoring import ray_role
from rlhfctl.engine.placement import EngineSettings, shard_model
from rlhfctl.engine.offload import HOST, move_optimizer_state, move_parameters, offloads, resident
from rlhfctl.engine.training import build_optimizer

OPTIM = {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}


def local_values(module: torch.nn.Module) -> list[torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return [(p.to_local() if isinstance(p, DTensor) else p).detach().clone() for p in module.parameters()]


@contextlib.contextmanager
def stepped_fsdp2_model() -> Iterator[tuple[torch.nn.Module, torch.optim.Optimizer]]:
    """A tiny FSDP2 model on a one-rank group, after one AdamW step (so the moments exist)."""
    module = load_causal_lm(TINY_MODEL, tokenizer(), seed=0)
    shard_model(module, EngineSettings("fsdp2", torch.float32, trainable=True), HOST)
    optimizer = build_optimizer(module, OPTIM)
    ids = fixed_batch().batch["input_ids"][:2]
    module(input_ids=ids).logits.float().square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    yield module, optimizer


def test_moves_copy_shards_and_moments_into_fresh_storage_with_equal_values():
    with stepped_fsdp2_model() as (module, optimizer):
        parameters = list(module.parameters())
        held: list = []  # the old storages stay alive, so no copy can land at one of their addresses
        before = storage_places(module, optimizer, held)
        values = local_values(module)
        moments = [v.clone() for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
        steps = [s["step"].clone() for s in optimizer.state.values()]
        logits = module(input_ids=fixed_batch().batch["input_ids"][:2]).logits.detach()

        move_parameters(module, HOST)
        move_optimizer_state(optimizer, HOST)
        after = storage_places(module, optimizer)
        assert not set(before["param_pointers"]) & set(after["param_pointers"])  # every shard was copied
        assert not set(before["moment_pointers"]) & set(after["moment_pointers"])
        assert after["param_devices"] == after["moment_devices"] == ["cpu"]
        assert all(a is b for a, b in zip(module.parameters(), parameters))  # the optimizer's keys still hold
        for old, new in zip(values, local_values(module)):
            assert torch.equal(old, new)
        for old, new in zip(moments, [v for s in optimizer.state.values() for v in s.values() if v.dim() > 0]):
            assert torch.equal(old, new)
        assert [s["step"] for s in optimizer.state.values()] == steps  # the scalar counters stay
        assert torch.equal(module(input_ids=fixed_batch().batch["input_ids"][:2]).logits.detach(), logits)


def test_resident_moves_what_the_settings_offload_once_for_nested_blocks():
    with stepped_fsdp2_model() as (module, optimizer):
        settings = EngineSettings("fsdp2", torch.float32, trainable=True, param_offload=True)
        held: list = []
        first = storage_places(module, optimizer, held)
        with resident(module, optimizer, settings, HOST):
            inside = storage_places(module, optimizer, held)
            with resident(module, optimizer, settings, HOST):  # a call inside a call moves nothing more
                assert storage_places(module, optimizer) == inside
        after = storage_places(module, optimizer)
        assert not set(first["param_pointers"]) & set(inside["param_pointers"])
        assert not set(inside["param_pointers"]) & set(after["param_pointers"])
        assert first["moment_pointers"] == after["moment_pointers"]  # optimizer_offload is off


@pytest.mark.parametrize("settings, expected", [
    (EngineSettings("fsdp2", torch.float32, True, param_offload=True, optimizer_offload=True), (True, True)),
    (EngineSettings("fsdp2", torch.float32, False, param_offload=True), (True, False)),
    (EngineSettings("fsdp2", torch.float32, True, cpu_offload=True, param_offload=True), (False, False)),
    (EngineSettings("ddp", torch.float32, True, param_offload=True, optimizer_offload=True), (False, False)),
    (None, (False, False)),
])
def test_what_a_role_offloads_between_calls(settings, expected):
    assert offloads(settings) == expected


def offload_recipe(offload: bool) -> dict:
    fsdp = {"param_offload": offload, "optimizer_offload": offload}
    return tiny_recipe(roles={"actor": {"strategy": "fsdp2", "fsdp": fsdp},
                              "reference": {"strategy": "fsdp2", "fsdp": {"param_offload": offload}}})


def run_actor(offload: bool) -> dict:
    """Log-probs, two updates, log-probs again, and where the state was between the calls."""
    batch = fixed_batch()
    seen = {}
    with ray_role(ScoringActor, offload_recipe(offload), "actor", f"offload-actor-{offload}") as group:
        seen["after_init"] = group.storage()
        seen["log_probs"] = group.compute_log_prob(batch).batch["old_log_probs"]
        seen["after_log_probs"] = group.storage()
        seen["metrics"] = [group.update_actor(off_policy(fixed_batch(step), seen["log_probs"])) for step in range(2)]
        seen["after_updates"] = group.storage()
        seen["updated"] = group.compute_log_prob(batch).batch["old_log_probs"]
    return seen


@pytest.mark.slow
def test_offload_gives_the_same_numbers_and_moves_the_state_between_calls(ray_session):
    plain, offloaded = run_actor(False), run_actor(True)
    # Tolerance 0: the moves copy values bit for bit, and every computation runs on the same device.
    assert torch.equal(offloaded["log_probs"], plain["log_probs"])
    assert torch.equal(offloaded["updated"], plain["updated"])
    assert not torch.equal(offloaded["updated"], offloaded["log_probs"])  # the updates moved the weights
    for step in range(2):
        for rank in range(2):
            for key in ("actor/pg_loss", "actor/grad_norm"):
                assert offloaded["metrics"][step][rank][key] == plain["metrics"][step][rank][key], (step, rank, key)
    for rank in range(2):
        # Without offload the shards stay in place from call to call; with it each call copies them back and forth.
        assert plain["after_init"][rank]["param_pointers"] == plain["after_log_probs"][rank]["param_pointers"]
        assert not set(offloaded["after_init"][rank]["param_pointers"]) & set(offloaded["after_log_probs"][rank]["param_pointers"])
        assert plain["after_updates"][rank]["moment_pointers"] and offloaded["after_updates"][rank]["moment_devices"] == ["cpu"]

    # A frozen reference with param_offload: its shards move between calls, its log-probs are the initial policy's.
    with ray_role(PlacedReference, offload_recipe(True), "reference", "offload-reference") as reference:
        before = reference.storage()
        ref_log_probs = reference.compute_ref_log_prob(fixed_batch()).batch["ref_log_prob"]
        after = reference.storage()
    assert torch.equal(ref_log_probs, plain["log_probs"])
    for rank in range(2):
        assert not set(before[rank]["param_pointers"]) & set(after[rank]["param_pointers"])


def test_a_stage_trainer_with_offload_trains_to_the_same_numbers():
    """SFT (FSDP2 at world 1) with param and optimizer offload: its state waits on the host between calls,
    and two steps give the plain run's losses exactly."""
    from rlhfctl.data.pairs import DemonstrationDataset, collate_demonstrations
    from rlhfctl.protocol import DataProto
    from rlhfctl.tasks import get_task
    from tests.workers.conftest import local_group
    from workers.sft import SFTWorker

    demos = list(DemonstrationDataset(get_task("digits").make_demonstrations(4, 0), tokenizer()))
    batch = DataProto.from_dict(collate_demonstrations(demos, tokenizer().pad_token_id), meta_info={"packed": False})
    losses = {}
    for offload in (False, True):
        fsdp = {"param_offload": offload, "optimizer_offload": offload}
        with local_group(SFTWorker, tiny_recipe(roles={"actor": {"strategy": "fsdp2", "fsdp": fsdp}}), "actor") as sft:
            worker = sft.workers[0]
            held: list = []
            before = storage_places(worker.module, worker.optimizer, held)
            losses[offload] = [sft.train_sft(batch)[0] for _ in range(2)]
            after = storage_places(worker.module, worker.optimizer, held)
            moved = not set(before["param_pointers"]) & set(after["param_pointers"])
            assert moved == offload and after["moment_devices"] == ["cpu"]
    assert losses[True] == losses[False]
