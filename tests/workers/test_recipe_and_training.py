"""Recipe defaults and fallbacks, LR schedules, batch arithmetic and the registry (no models)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlhfctl.single_controller import Dispatch, Execute, registered_methods
from tests.workers.recipes import TINY_MODEL, tiny_recipe
from rlhfctl.recipe import recipe_from_dict
from rlhfctl.recipe.check_runtime import check_workers
from rlhfctl.recipe.importing import import_class
from rlhfctl.recipe.schema import ActorRole, CriticRole, ReferenceRole, RewardRole
from workers import ActorWorker, CriticWorker, ReferenceWorker, RewardWorker
from rlhfctl.engine.placement import ONE_TO_ALL_FIRST
from rlhfctl.recipe.resolve import samples_per_rank
from rlhfctl.recipe.resolved import DEFAULT_INLINE_MODEL, resolve, resolve_mapping
from rlhfctl.engine.training import LRSchedule, build_optimizer


def test_missing_and_null_keys_take_defaults_and_trainer_fallbacks():
    recipe = resolve_mapping(tiny_recipe(trainer={"ppo_epochs": 3, "mini_batch_size": 8}, roles={"actor": {"clip_ratio_high": 0.28}}))
    actor = recipe.role("actor").settings
    assert actor["ppo_epochs"] == 3 and actor["mini_batch_size"] == 8
    assert actor["clip_ratio_high"] == 0.28 and actor["clip_ratio_low"] == 0.2 and actor["lora"] is None
    optim = recipe.role("actor").optim
    assert optim["lr"] == 1e-2 and optim["betas"] == [0.9, 0.999] and optim["lr_schedule"] == "constant"
    assert resolve_mapping({}).algorithm.kl.loss_kind == "k3"
    with pytest.raises(dataclasses.FrozenInstanceError, match="read-only"):
        actor.ppo_epochs = 1
    with pytest.raises(TypeError, match="read-only"):
        optim["betas"].append(0.5)


def test_the_critics_own_warmup_replaces_its_optimizers_when_positive():
    """roles.critic.warmup_steps (schema: "when > 0 it replaces optim.warmup_steps") reaches the critic's schedule."""
    def optim(roles, role):
        return resolve_mapping(tiny_recipe(roles=roles)).role(role).optim

    assert optim({"critic": {"warmup_steps": 3, "optim": {"warmup_steps": 1}}}, "critic")["warmup_steps"] == 3
    assert optim({"critic": {"warmup_steps": 0, "optim": {"warmup_steps": 1}}}, "critic")["warmup_steps"] == 1
    assert optim({"actor": {"optim": {"warmup_steps": 2}}}, "actor")["warmup_steps"] == 2


def test_reference_and_critic_fall_back_to_the_actor_model():
    recipe = resolve_mapping(tiny_recipe(roles={"critic": {}}))
    assert recipe.role("reference").model["config"] == TINY_MODEL["config"]
    assert recipe.role("critic").model["dtype"] == "float32"
    own = resolve_mapping(tiny_recipe(roles={"critic": {"model": {"path": "/some/dir"}}}))
    assert own.role("critic").model["path"] == "/some/dir"
    assert resolve_mapping({}).role("actor").model["config"] == DEFAULT_INLINE_MODEL


def test_gpu_use_follows_the_role_pool():
    pools = {"resource_pools": {"gpu": {"use_gpu": True}, "cpu": {"use_gpu": False}}}
    assert resolve_mapping({**pools, "roles": {"actor": {"pool": "gpu"}}}).role("actor").use_gpu
    assert not resolve_mapping({**pools, "roles": {"reward": {"pool": "cpu"}}}).role("reward").use_gpu
    assert not resolve_mapping(tiny_recipe()).role("actor").use_gpu


def test_per_rank_mini_batch_is_prompts_times_n_over_world_size():
    assert samples_per_rank(None, 4, 2, rows=16) == 16
    assert samples_per_rank(4, 4, 2, rows=16) == 8
    assert samples_per_rank(1, 1, 4, rows=16) == 1  # never below one row
    assert samples_per_rank(64, 4, 1, rows=16) == 16  # never above the shard


def lr_curve(kind: str, steps: int, **kwargs) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, LRSchedule(kind, **kwargs))
    curve = []
    for _ in range(steps):
        curve.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return curve


def test_lr_schedules():
    constant = lr_curve("constant", 3, warmup_steps=2, total_steps=None, min_lr_ratio=0.0)
    assert constant == pytest.approx([1 / 3, 2 / 3, 1.0])
    linear = lr_curve("linear", 5, warmup_steps=0, total_steps=4, min_lr_ratio=0.0)
    assert linear == pytest.approx([1, 0.75, 0.5, 0.25, 0])
    cosine = lr_curve("cosine", 5, warmup_steps=1, total_steps=5, min_lr_ratio=0.1)
    assert cosine[0] == pytest.approx(0.5) and cosine[1] == pytest.approx(1.0) and cosine[-1] > 0.1
    assert lr_curve("cosine", 7, warmup_steps=1, total_steps=5, min_lr_ratio=0.1)[-1] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="needs trainer.total_steps"):
        LRSchedule("linear", 0, None, 0.0)
    with pytest.raises(ValueError, match="unknown lr_schedule"):
        LRSchedule("step", 0, 10, 0.0)


def test_optimizer_is_fused_adamw_with_the_recipe_settings_and_steps_like_the_plain_one():
    recipe = tiny_recipe(roles={"actor": {"optim": {"lr": 0.01, "weight_decay": 0.1, "betas": [0.8, 0.9]}}})
    optim = resolve_mapping(recipe).role("actor").optim
    torch.manual_seed(0)
    fused_model, plain_model = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    plain_model.load_state_dict(fused_model.state_dict())
    fused = build_optimizer(fused_model, optim)
    assert isinstance(fused, torch.optim.AdamW) and fused.defaults["fused"] is True
    assert fused.defaults["lr"] == 0.01 and fused.defaults["weight_decay"] == 0.1 and fused.defaults["betas"] == (0.8, 0.9)
    plain = torch.optim.AdamW(plain_model.parameters(), lr=0.01, weight_decay=0.1, betas=(0.8, 0.9), foreach=False)
    inputs = torch.randn(5, 4)
    for _ in range(3):
        for model, optimizer in ((fused_model, fused), (plain_model, plain)):
            optimizer.zero_grad()
            model(inputs).square().mean().backward()
            optimizer.step()
    torch.testing.assert_close(fused_model.weight, plain_model.weight, rtol=1e-5, atol=1e-6)


def test_registered_methods_and_their_dispatch_modes():
    actor = registered_methods(ActorWorker)
    expected = {
        "init_model": Dispatch.ONE_TO_ALL,
        "generate_sequences": Dispatch.ALL_TO_ALL,
        "compute_log_prob": Dispatch.ALL_TO_ALL,
        "compute_ref_log_prob": Dispatch.ALL_TO_ALL,
        "update_actor": Dispatch.ALL_TO_ALL,
        "save_checkpoint": Dispatch.ONE_TO_ALL,
        "load_checkpoint": Dispatch.ONE_TO_ALL,
        "export_hf": ONE_TO_ALL_FIRST,  # every rank gathers its shards, the caller gets rank 0's path
        "state_fingerprint": Dispatch.ONE_TO_ALL,
    }
    for name, mode in expected.items():
        assert actor[name].dispatch_mode is mode, name
    assert actor["export_hf"].execute_mode is Execute.ALL
    assert {"compute_values", "update_critic", "save_checkpoint"} <= set(registered_methods(CriticWorker))
    assert "compute_ref_log_prob" in registered_methods(ReferenceWorker)
    assert "compute_rewards" in registered_methods(RewardWorker)


def test_worker_classes_resolve_by_role_or_import_path():
    """The schema names each role's default class; any module.Class or module:Class imports (workers/registry.py is gone)."""
    defaults = {"actor": (ActorRole, ActorWorker), "critic": (CriticRole, CriticWorker),
                "reference": (ReferenceRole, ReferenceWorker), "reward": (RewardRole, RewardWorker)}
    for role, (section, cls) in defaults.items():
        assert import_class(section().worker, f"roles.{role}.worker") is cls
    assert import_class("workers.critic:CriticWorker", "roles.critic.worker") is CriticWorker
    recipe = {"roles": {"actor": {"worker": "torch.nn:Linear", "model": TINY_MODEL}}, "data": {"task": "digits"}}
    issues = check_workers(resolve(recipe_from_dict(recipe)))
    assert [issue.key_path for issue in issues] == ["roles.actor.worker"]
    assert "lacks registered method(s)" in issues[0].message
