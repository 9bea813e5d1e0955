"""Bundled recipes: each loads and validates against the real workers; list/find/copy."""

from __future__ import annotations

import importlib.util

import pytest

from rlhfctl.recipe import RecipeError, load_recipe, validate_recipe
from rlhfctl.recipe.bundled import copy_bundled, find_bundled, list_bundled

_WORKERS_MISSING = importlib.util.find_spec("workers") is None
NAMES = ["70b-32gpu", "agent-pipeline", "colocated-8gpu", "dapo-quickstart", "distill-pipeline", "dpo-quickstart", "lora-ppo", "pipeline-quickstart", "ppo-gae", "quickstart", "qwen2.5-0.5b-gsm8k",
         "reasoning-gym-pipeline", "reasoning-gym-quickstart", "reward-model-quickstart", "sft-quickstart"]
PIPELINES = ["agent-pipeline", "distill-pipeline", "pipeline-quickstart", "reasoning-gym-pipeline"]  # pipeline files (rlhfctl pipeline), tested in tests/pipeline
RECIPES = [name for name in NAMES if name not in PIPELINES]


def test_the_bundled_recipes_are_listed_with_descriptions():
    recipes = list_bundled()
    assert [recipe.name for recipe in recipes] == NAMES
    assert all(recipe.description and not recipe.description.startswith("#") for recipe in recipes)


@pytest.mark.skipif(_WORKERS_MISSING, reason="the workers package (workers.actor, ...) is not importable")
@pytest.mark.parametrize("name", RECIPES)
def test_every_bundled_recipe_validates(name, tmp_path):
    cfg = load_recipe(find_bundled(name).path)
    overrides = []
    if cfg.data.train_files:
        data = tmp_path / "train.jsonl"
        data.write_text('{"prompt": "1 + 1 =", "ground_truth": "2"}\n')
        overrides.append(f"data.train_files=[{data}]")
    report = validate_recipe(load_recipe(find_bundled(name).path, overrides))
    assert report.ok, [issue.message for issue in report.errors]


@pytest.mark.skipif(_WORKERS_MISSING, reason="the workers package (workers.actor, ...) is not importable")
def test_real_model_recipe_reports_its_missing_data_file(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    report = validate_recipe(load_recipe(find_bundled("qwen2.5-0.5b-gsm8k").path))
    assert [issue.key_path for issue in report.errors] == ["data.train_files[0]"]


def test_quickstart_essentials():
    cfg = load_recipe(find_bundled("quickstart").path)
    assert cfg.roles.actor.model.config.hidden_size == 64 and cfg.roles.actor.model.config.num_key_value_heads == 2
    assert cfg.rollout.n == 4 and cfg.rollout.max_new_tokens == 24 and cfg.rollout.top_k == 0
    assert (cfg.trainer.total_steps, cfg.trainer.batch_size, cfg.trainer.mini_batch_size) == (40, 16, 16)
    assert cfg.roles.actor.optim.lr == pytest.approx(1e-3) and cfg.data.task == "digits"
    assert {cfg.roles[role].pool for role in ("actor", "reference", "reward")} == {"main"}


def test_find_unknown_name_suggests():
    with pytest.raises(RecipeError) as caught:
        find_bundled("quikstart")
    assert "did you mean 'quickstart'" in str(caught.value)


def test_copy_refuses_to_overwrite_without_force(tmp_path):
    target = copy_bundled("quickstart", tmp_path)
    assert target == tmp_path / "quickstart.yaml" and target.read_text() == find_bundled("quickstart").path.read_text()
    target.write_text("edited")
    with pytest.raises(RecipeError) as caught:
        copy_bundled("quickstart.yaml", target)
    assert "--force" in str(caught.value) and target.read_text() == "edited"
    copy_bundled("quickstart", target, force=True)
    assert target.read_text() != "edited"


def test_an_installed_copy_under_recipes_bundled_is_found(tmp_path, monkeypatch):
    import rlhfctl

    package = tmp_path / "site-packages" / "rlhfctl"
    (package / "recipes_bundled").mkdir(parents=True)
    (package / "recipes_bundled" / "mine.yaml").write_text("# An installed recipe.\ntrainer: {total_steps: 1}\n")
    monkeypatch.setattr(rlhfctl, "__file__", str(package / "__init__.py"))
    recipes = list_bundled()
    assert [(recipe.name, recipe.description) for recipe in recipes] == [("mine", "An installed recipe.")]
    assert find_bundled("mine").path == package / "recipes_bundled" / "mine.yaml"


@pytest.mark.skipif(_WORKERS_MISSING, reason="the workers package (workers.actor, ...) is not importable")
@pytest.mark.parametrize("name", ["qwen2.5-0.5b-gsm8k", "colocated-8gpu"])
def test_gpu_recipes_validate_from_the_repository_root_with_the_bundled_sample(monkeypatch, name):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    report = validate_recipe(load_recipe(find_bundled(name).path))
    assert report.errors == []
    assert any("GPU" in str(issue) for issue in report.warnings)  # no GPU here: a warning, not an error
