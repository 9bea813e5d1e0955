"""The Hugging Face weights of a trained role (checkpoints' ``hf/``, ``export_hf``) are in its compute
dtype by default, not in its float32 masters; ``trainer.export_dtype`` still asks for another."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from rlhfctl.recipe.resolve import export_dtype
from tests.workers.conftest import local_group
from tests.workers.recipes import tiny_recipe
from workers import ActorWorker


def hf_dtypes(directory: Path) -> set[torch.dtype]:
    with safe_open(str(directory / "hf" / "model.safetensors"), framework="pt") as weights:
        return {weights.get_tensor(name).dtype for name in weights.keys()}


@pytest.mark.parametrize(("asked", "expected"), [(None, torch.bfloat16), ("float32", torch.float32)])
def test_a_bf16_role_saves_hf_in_bf16_unless_asked_for_float32(tmp_path, asked, expected):
    recipe = tiny_recipe(roles={"actor": {"model": {"dtype": "bfloat16"}}}, trainer={"export_dtype": asked})
    with local_group(ActorWorker, recipe, "actor") as actor:
        assert {p.dtype for p in actor.workers[0].module.parameters()} == {torch.float32}  # the masters
        (path,) = actor.save_checkpoint(str(tmp_path))
    assert hf_dtypes(Path(path)) == {expected}


def test_the_export_dtype_is_the_trainer_setting_else_the_role_compute_dtype():
    assert export_dtype({"export_dtype": None}, torch.bfloat16) is torch.bfloat16
    assert export_dtype({"export_dtype": "auto"}, torch.bfloat16) is torch.bfloat16
    assert export_dtype({"export_dtype": "float32"}, torch.bfloat16) == "float32"
