"""roles.<role>.strategy / roles.<role>.fsdp.*: bad combinations exit 2 naming the key; good ones validate."""

from __future__ import annotations

import pytest

from rlhfctl.cli import app
from tests.recipe.builders import BASE_RECIPE, write_recipe
from rlhfctl.recipe.resolve import resolve_strategy


@pytest.fixture
def runner():
    from typer.testing import CliRunner

    return CliRunner()


@pytest.mark.parametrize("overrides, key", [
    (["roles.reward.strategy=fsdp2"], "roles.reward.strategy"),  # a reward function has no model to shard
    (["roles.actor.strategy=ddp", "roles.actor.fsdp.cpu_offload=true"], "roles.actor.fsdp.cpu_offload"),
    (["resource_pools.main.process_on_nodes=[1]", "roles.actor.fsdp.cpu_offload=true"], "roles.actor.fsdp.cpu_offload"),
    (["roles.actor.strategy=ddp", "roles.actor.fsdp.param_offload=true"], "roles.actor.fsdp.param_offload"),
    (["resource_pools.main.process_on_nodes=[1]", "roles.actor.fsdp.optimizer_offload=true"], "roles.actor.fsdp.optimizer_offload"),
    (["roles.actor.strategy=zero3"], "roles.actor.strategy"),
])
def test_bad_strategy_settings_exit_2_naming_the_key(runner, tmp_path, overrides, key):
    result = runner.invoke(app, ["validate", str(write_recipe(tmp_path, BASE_RECIPE)), *overrides])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert key in result.stderr
    if "offload" in key:
        assert "needs strategy fsdp2" in result.stderr and "set roles.actor.strategy: fsdp2" in result.stderr


def test_fsdp2_with_offload_and_export_dtype_validate(runner, tmp_path):
    overrides = ["roles.actor.strategy=fsdp2", "roles.actor.fsdp.cpu_offload=true", "roles.reference.strategy=ddp",
                 "roles.actor.fsdp.param_offload=true", "roles.actor.fsdp.optimizer_offload=true",
                 "trainer.export_dtype=bfloat16", "roles.actor.fsdp.reshard_after_forward=false"]
    result = runner.invoke(app, ["validate", str(write_recipe(tmp_path, BASE_RECIPE)), *overrides])
    assert result.exit_code == 0, result.output


def test_the_default_strategy_is_fsdp2_with_more_than_one_rank():
    assert resolve_strategy(None, 2) == "fsdp2"
    assert resolve_strategy(None, 1) == "ddp"
    assert resolve_strategy("ddp", 8) == "ddp"


@pytest.mark.parametrize("name, world, strategy", [("qwen2.5-0.5b-gsm8k.yaml", 1, "ddp"), ("colocated-8gpu.yaml", 8, "fsdp2")])
def test_the_shipped_gpu_recipes_keep_float32_masters_under_bf16_compute(name, world, strategy):
    import torch
    from omegaconf import OmegaConf

    from rlhfctl.recipe import load_recipe
    from tests.trainer.test_training_runs import RECIPES
    from rlhfctl.engine.placement import engine_settings

    recipe = OmegaConf.to_container(load_recipe(RECIPES / name), resolve=True)
    settings = engine_settings(recipe, "actor", recipe["roles"]["actor"]["model"]["dtype"], world, trainable=True)
    assert (settings.strategy, settings.compute_dtype, settings.storage_dtype) == (strategy, torch.bfloat16, torch.float32)
    frozen = engine_settings(recipe, "reference", recipe["roles"]["actor"]["model"]["dtype"], world, trainable=False)
    assert frozen.storage_dtype == torch.bfloat16
