"""What rlhfctl eval / generate load for a run directory, a checkpoint, a model directory or a hub id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfctl.evaluation.policy_source import find_policy
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.trainer import checkpoint


def _run(tmp_path: Path, steps: tuple[int, ...]) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "recipe.yaml").write_text("trainer: {total_steps: 2}\n")
    for step in steps:
        directory = run / "checkpoints" / f"step_{step}"
        directory.mkdir()
        (directory / checkpoint.STATE_FILE).write_text(json.dumps({"step": step}))  # a checkpoint from before manifests
    return run


def test_a_run_directory_means_its_newest_complete_checkpoint_and_its_recipe(tmp_path):
    run = _run(tmp_path, (1, 3))
    source = find_policy(str(run))
    assert source.checkpoint == run / "checkpoints" / "step_3" and source.step == 3
    assert source.recipe == str(run / "recipe.yaml") and source.model_path is None


def test_a_checkpoint_directory_is_loaded_with_the_recipe_of_its_run_unless_one_is_named(tmp_path):
    run = _run(tmp_path, (1, 3))
    source = find_policy(str(run / "checkpoints" / "step_1"))
    assert source.step == 1 and source.recipe == str(run / "recipe.yaml")
    assert find_policy(str(run / "checkpoints" / "step_1"), "quickstart").recipe == "quickstart"


def test_a_model_directory_takes_the_run_recipe_beside_it_or_needs_one(tmp_path):
    run = _run(tmp_path, ())
    (run / "model").mkdir()
    (run / "model" / "config.json").write_text("{}")
    source = find_policy(str(run / "model"))
    assert source.model_path == str((run / "model").resolve()) and source.checkpoint is None and source.step == 0
    assert source.recipe == str(run / "recipe.yaml")
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "config.json").write_text("{}")
    with pytest.raises(RecipeError, match="--recipe"):
        find_policy(str(alone))


def test_a_hub_id_needs_a_recipe_and_anything_else_is_refused_by_name(tmp_path):
    assert find_policy("Qwen/Qwen2.5-0.5B", "quickstart").model_path == "Qwen/Qwen2.5-0.5B"
    with pytest.raises(RecipeError, match="--recipe"):
        find_policy("Qwen/Qwen2.5-0.5B")
    run = _run(tmp_path, ())
    with pytest.raises(RecipeError, match="no complete checkpoint"):
        find_policy(str(run))
    with pytest.raises(RecipeError, match="not a run"):
        find_policy(str(tmp_path))
