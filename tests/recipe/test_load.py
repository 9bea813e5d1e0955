"""load_recipe: layering (schema, YAML, overrides) and one clean RecipeError per problem class."""

from __future__ import annotations

import pytest
from omegaconf import DictConfig

from rlhfctl.recipe import RecipeError, load_recipe
from tests.recipe.builders import BASE_RECIPE, recipe_data, write_recipe


def _error(path, overrides=()) -> RecipeError:
    with pytest.raises(RecipeError) as caught:
        load_recipe(path, list(overrides))
    return caught.value


def test_loads_defaults_under_the_yaml(recipe_file):
    cfg = load_recipe(recipe_file)
    assert isinstance(cfg, DictConfig)
    assert cfg.trainer.total_steps == 2
    assert cfg.trainer.ppo_epochs == 1  # schema default
    assert cfg.roles.actor.optim.betas == [0.9, 0.999]
    assert cfg.roles.critic is None
    assert cfg.roles.actor.lora is None
    assert list(cfg.resource_pools) == ["main"]


def test_recipe_pools_replace_the_default_pool(tmp_path):
    data = recipe_data(resource_pools={"gen": {"process_on_nodes": [1]}})
    data["roles"]["actor"]["pool"] = "gen"
    cfg = load_recipe(write_recipe(tmp_path, data))
    assert list(cfg.resource_pools) == ["gen"]
    assert cfg.resource_pools.gen.max_colocate_count == 4


def test_overrides_scalars_lists_sections_and_deletion(recipe_file):
    cfg = load_recipe(recipe_file, [
        "trainer.total_steps=10",
        "data.train_files=[a.jsonl,b.jsonl]",
        "roles.critic.cliprange_value=0.3",     # creates the null critic with defaults
        "roles.actor.lora={r: 4}",
        "~roles.reference",                      # nullable: back to null
        "~trainer.batch_size",                   # not nullable: back to the schema default
        "~roles.actor.model.config.hidden_size",  # an entry of a free-form mapping: removed
        "resource_pools.extra.use_gpu=true",
    ])
    assert cfg.trainer.total_steps == 10
    assert list(cfg.data.train_files) == ["a.jsonl", "b.jsonl"]
    assert cfg.roles.critic.cliprange_value == 0.3 and cfg.roles.critic.loss_agg_mode == "token-mean"
    assert cfg.roles.actor.lora.r == 4 and cfg.roles.actor.lora.target_modules == "all-linear"
    assert cfg.roles.reference is None
    assert cfg.trainer.batch_size == 16
    assert "hidden_size" not in cfg.roles.actor.model.config
    assert cfg.resource_pools.extra.use_gpu is True and "main" in cfg.resource_pools


def test_deleting_a_pool_and_a_later_override_wins(recipe_file):
    cfg = load_recipe(recipe_file, ["resource_pools.extra.use_gpu=true", "~resource_pools.extra",
                                    "trainer.seed=1", "trainer.seed=2"])
    assert list(cfg.resource_pools) == ["main"]
    assert cfg.trainer.seed == 2


def test_interpolation_is_resolved(recipe_file):
    cfg = load_recipe(recipe_file, ["trainer.mini_batch_size=${trainer.batch_size}"])
    assert cfg.trainer.mini_batch_size == 16


def test_unknown_key_suggests_the_closest(recipe_file):
    error = _error(recipe_file, ["trainer.total_step=3"])
    assert error.kind == "unknown_key" and error.key_path == "trainer.total_step"
    assert "did you mean 'trainer.total_steps'" in str(error)


def test_unknown_role_is_an_error(tmp_path):
    data = recipe_data()
    data["roles"]["judge"] = {"worker": "x.Y"}
    error = _error(write_recipe(tmp_path, data))
    assert error.kind == "unknown_key" and error.key_path == "roles.judge"
    assert "actor, reference, critic, reward" in str(error)


def test_unknown_key_in_yaml_names_the_nested_path(tmp_path):
    data = recipe_data()
    data["roles"]["actor"]["optim"] = {"lrr": 0.1}
    error = _error(write_recipe(tmp_path, data))
    assert error.key_path == "roles.actor.optim.lrr"
    assert "did you mean 'roles.actor.optim.lr'" in str(error)


@pytest.mark.parametrize("override, key, expected", [
    ("trainer.total_steps=abc", "trainer.total_steps", "an integer"),
    ("roles.actor.optim.lr=fast", "roles.actor.optim.lr", "a number"),
    ("rollout.do_sample=maybe", "rollout.do_sample", "true or false"),
    ("data.train_files=a.jsonl", "data.train_files", "a list of strings"),
    ("roles=3", "roles", "a mapping"),
    ("resource_pools.main.process_on_nodes=[a]", "resource_pools.main.process_on_nodes[0]", "an integer"),
    ("trainer.batch_size=1.5", "trainer.batch_size", "an integer"),
])
def test_wrong_type_names_key_expected_type_and_value(recipe_file, override, key, expected):
    error = _error(recipe_file, [override])
    assert error.kind == "wrong_type" and error.key_path == key
    assert key in str(error) and expected in str(error)
    assert repr(override.partition("=")[2].strip("[]")) in str(error) or "got" in str(error)


@pytest.mark.parametrize("overrides, key", [
    (["trainer.total_steps=null"], "trainer.total_steps"),
    (["~roles.actor"], "roles.actor"),
    (["roles.actor.model.config=null"], "roles.actor.model.path"),
    (["~data.task"], "data.train_files"),
    (["trainer.output_dir=???"], "trainer.output_dir"),
])
def test_missing_required_value(recipe_file, overrides, key):
    error = _error(recipe_file, overrides)
    assert error.kind == "missing" and error.key_path == key
    assert "missing required value" in str(error)


def test_required_marker_in_yaml_must_be_overridden(tmp_path):
    data = recipe_data()
    data["roles"]["actor"]["model"] = {"path": "???"}
    path = write_recipe(tmp_path, data)
    assert _error(path).key_path == "roles.actor.model.path"
    assert load_recipe(path, ["roles.actor.model.path=org/model"]).roles.actor.model.path == "org/model"


@pytest.mark.parametrize("override, key, choice", [
    ("ray.backend=slurm", "ray.backend", "ray, local"),
    ("roles.actor.loss_agg_mode=token-sum", "roles.actor.loss_agg_mode", "token-mean"),
    ("data.task=digts", "data.task", "did you mean 'digits'"),
    ("algorithm.kl.kind=k9", "algorithm.kl.kind", "k1, k2, k3"),
    ("roles.actor.model.dtype=float8", "roles.actor.model.dtype", "bfloat16"),
])
def test_bad_enum_lists_the_choices(recipe_file, override, key, choice):
    error = _error(recipe_file, [override])
    assert error.kind == "bad_choice" and error.key_path == key
    assert "is not one of" in str(error) and choice in str(error)


@pytest.mark.parametrize("override, key", [
    ("trainer.batch_size=0", "trainer.batch_size"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("roles.actor.optim.betas=[0.9, 1.0]", "roles.actor.optim.betas[1]"),
    ("roles.actor.optim.betas=[0.9]", "roles.actor.optim.betas"),
    ("roles.actor.clip_ratio_c=1.0", "roles.actor.clip_ratio_c"),
    ("rollout.temperature=.nan", "rollout.temperature"),
])
def test_out_of_range(recipe_file, override, key):
    error = _error(recipe_file, [override])
    assert error.kind == "out_of_range" and error.key_path == key


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = write_recipe(tmp_path, "trainer:\n  total_steps: 3\n batch_size: [\n")
    error = _error(path)
    assert error.kind == "yaml_syntax"
    assert f"{path}:3:" in str(error)


def test_duplicate_yaml_key_is_a_syntax_error(tmp_path):
    error = _error(write_recipe(tmp_path, "trainer: {}\ntrainer: {}\n"))
    assert error.kind == "yaml_syntax" and "duplicate key" in str(error)


def test_top_level_list_is_rejected(tmp_path):
    assert _error(write_recipe(tmp_path, "- 1\n- 2\n")).kind == "wrong_type"


def test_missing_recipe_file(tmp_path):
    error = _error(tmp_path / "nope.yaml")
    assert error.kind == "file_not_found" and "nope.yaml" in str(error)


@pytest.mark.parametrize("override", ["trainer", "~trainer.seed=3", "a[0]=1", "trainer.total_steps=[1"])
def test_malformed_overrides(recipe_file, override):
    assert _error(recipe_file, [override]).kind == "override_syntax"


def test_deleting_an_absent_pool_suggests_one(recipe_file):
    error = _error(recipe_file, ["~resource_pools.mian"])
    assert error.key_path == "resource_pools.mian" and "did you mean 'main'" in str(error)


def test_bad_interpolation(recipe_file):
    error = _error(recipe_file, ["trainer.total_steps=${nope.key}"])
    assert error.kind == "interpolation" and error.key_path == "trainer.total_steps"


def test_keys_of_a_scalar(recipe_file):
    error = _error(recipe_file, ["trainer.total_steps.x=1"])
    assert error.key_path == "trainer.total_steps.x"


def test_no_eval_of_strings(recipe_file):
    cfg = load_recipe(recipe_file, ["trainer.output_dir=__import__('os').getcwd()"])
    assert cfg.trainer.output_dir == "__import__('os').getcwd()"


def test_base_recipe_is_not_mutated(recipe_file):
    load_recipe(recipe_file, ["roles.actor.lora={r: 2}"])
    assert "lora" not in BASE_RECIPE["roles"]["actor"]
