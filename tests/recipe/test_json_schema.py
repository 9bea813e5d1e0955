"""The recipe's JSON Schema (rlhfctl recipes schema): generated from the schema dataclasses, shipped as
recipes/recipe.schema.json, named by the first line of every bundled recipe and of a copied one."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from omegaconf import OmegaConf

from rlhfctl.cli import app
from rlhfctl.pipeline.load import is_pipeline_file
from rlhfctl.recipe import RecipeError, RecipeSchema, recipe_from_dict
from rlhfctl.recipe.bundled import bundled_dir, find_bundled, list_bundled, recipe_description
from rlhfctl.recipe.field_checks import is_placeholder
from rlhfctl.recipe.json_schema import (
    MODELINE,
    PLACEHOLDER_PATTERN,
    SCHEMA_FILE_NAME,
    modeline_target,
    recipe_json_schema,
    render_json_schema,
    write_schema_beside,
)
from rlhfctl.recipe.load import read_recipe_file
from rlhfctl.recipe.typespec import iter_fields

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "recipes" / SCHEMA_FILE_NAME
RECIPES = [recipe for recipe in list_bundled() if not is_pipeline_file(recipe.path)]
PIPELINES = [recipe for recipe in list_bundled() if is_pipeline_file(recipe.path)]


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = recipe_json_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


@pytest.fixture
def runner():
    from typer.testing import CliRunner

    return CliRunner()


def _errors(validator: Draft202012Validator, data: dict) -> list[tuple[list, str]]:
    return [(list(error.absolute_path), error.message) for error in validator.iter_errors(data)]


def _at(path: str, value, base: dict) -> dict:
    """``base`` with ``value`` set at the dotted ``path`` (a deep copy)."""
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


def _walk_schema(node, path=()):
    """(path, node) of every object schema with properties, depth first."""
    if isinstance(node, dict):
        if "properties" in node:
            yield path, node
            for name, child in node["properties"].items():
                yield from _walk_schema(child, (*path, name))
        for key in ("additionalProperties", "items"):
            if isinstance(node.get(key), dict):
                yield from _walk_schema(node[key], (*path, f"<{key}>"))


# ---------------------------------------------------------------------------------- the bundled recipes
def test_the_bundled_recipes_are_all_checked():
    assert len(RECIPES) >= 10 and {recipe.name for recipe in RECIPES} >= {"quickstart", "ppo-gae", "lora-ppo"}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda recipe: recipe.name)
def test_every_bundled_recipe_validates_against_the_schema(validator, recipe):
    assert _errors(validator, read_recipe_file(recipe.path)) == []


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda recipe: recipe.name)
def test_every_bundled_recipe_names_the_shipped_schema_on_its_first_line(recipe):
    text = recipe.path.read_text(encoding="utf-8")
    assert text.split("\n", 1)[0] == MODELINE
    target = recipe.path.parent / modeline_target(text)
    assert target.is_file() and target == bundled_dir() / SCHEMA_FILE_NAME
    assert recipe.description and "yaml-language-server" not in recipe.description  # recipes list skips the line


@pytest.mark.parametrize("recipe", PIPELINES, ids=lambda recipe: recipe.name)
def test_pipeline_files_do_not_name_the_recipe_schema(recipe):
    # a pipeline file (output_dir, stages) is no recipe: the recipe schema would flag every key of it
    assert modeline_target(recipe.path.read_text(encoding="utf-8")) is None


def test_the_shipped_schema_is_the_commands_output(runner):
    result = runner.invoke(app, ["recipes", "schema"])
    assert result.exit_code == 0, result.output
    assert SHIPPED.read_text(encoding="utf-8") == result.stdout == render_json_schema(), (
        "recipes/recipe.schema.json is stale: run  rlhfctl recipes schema --output recipes/recipe.schema.json")


def test_the_wheel_ships_the_schema_beside_the_recipes():
    setup = (REPO / "setup.py").read_text(encoding="utf-8")
    assert '"rlhfctl.recipes_bundled": ["*.yaml", "recipe.schema.json"]' in setup


# ---------------------------------------------------------------------------------- the command
def test_schema_command_prints_a_draft_2020_12_schema(runner):
    result = runner.invoke(app, ["recipes", "schema"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.stdout)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    total_steps = schema["properties"]["trainer"]["properties"]["total_steps"]
    assert "integer" in total_steps["type"] and total_steps["default"] == 40 and total_steps["minimum"] == 1
    assert total_steps["description"] == "training steps (one batch of prompts each)"


def test_schema_command_writes_output_file(runner, tmp_path):
    target = tmp_path / "configs" / "recipe.schema.json"
    result = runner.invoke(app, ["recipes", "schema", "--output", str(target)])
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and target.read_text(encoding="utf-8") == render_json_schema()
    blocked = tmp_path / "file"
    blocked.write_text("")
    refused = runner.invoke(app, ["recipes", "schema", "--output", str(blocked / "schema.json")])
    assert refused.exit_code == 2 and "cannot write the schema" in refused.stderr


# ---------------------------------------------------------------------------------- what the schema says
def test_keys_types_defaults_choices_and_bounds_come_from_the_schema_module():
    props = recipe_json_schema()["properties"]
    assert props["ray"]["properties"]["backend"]["anyOf"][0] == {"enum": ["ray", "local"]}
    assert props["ray"]["properties"]["backend"]["default"] == "ray"
    top_p = props["rollout"]["properties"]["top_p"]
    assert (top_p["exclusiveMinimum"], top_p["maximum"], top_p["default"]) == (0, 1, 1.0)
    assert props["ray"]["properties"]["num_cpus"]["type"] == ["integer", "null", "string"]  # nullable (Optional)
    task = props["data"]["properties"]["task"]
    assert "digits" in task["anyOf"][0]["enum"] and None in task["anyOf"][0]["enum"]  # a choice provider, nullable
    betas = props["roles"]["properties"]["actor"]["properties"]["optim"]["properties"]["betas"]
    assert (betas["minItems"], betas["maxItems"], betas["items"]["minimum"], betas["items"]["exclusiveMaximum"]) == (2, 2, 0, 1)
    assert props["resource_pools"]["default"] == {"main": {"process_on_nodes": [1], "use_gpu": False,
                                                           "max_colocate_count": 4, "num_cpus_per_process": None}}


def test_every_schema_field_is_described_and_every_key_path_is_there():
    schema = recipe_json_schema()
    described = {}
    for path, node in _walk_schema(schema):
        for name, child in node["properties"].items():
            assert child.get("description"), (*path, name)
            described[".".join((*path, name)).replace("<additionalProperties>", "<name>")] = child
    assert sorted(described) == sorted(field.path for field in iter_fields())


def test_sections_are_closed_and_mappings_of_names_are_open():
    props = recipe_json_schema()["properties"]
    assert recipe_json_schema()["additionalProperties"] is False
    assert props["trainer"]["additionalProperties"] is False and props["roles"]["additionalProperties"] is False
    actor = props["roles"]["properties"]["actor"]["properties"]
    assert actor["model"]["properties"]["config"]["additionalProperties"] is True  # inline transformers config
    assert props["roles"]["properties"]["reward"]["properties"]["function_kwargs"]["additionalProperties"] is True
    pool = props["resource_pools"]["additionalProperties"]  # any pool name, each a closed pool section
    assert pool["additionalProperties"] is False and "process_on_nodes" in pool["properties"]


def test_the_schemas_defaults_validate(validator):
    defaults = OmegaConf.to_container(OmegaConf.structured(RecipeSchema))
    assert _errors(validator, defaults) == []
    assert _errors(validator, {}) == []  # every key has a default: an empty recipe is well formed


# ---------------------------------------------------------------------------------- the schema against the loader
QUICKSTART = read_recipe_file(find_bundled("quickstart").path)

REJECTED = [  # (key path, value, where the schema's error is, the loader's key_path)
    ("trainer.total_step", 10, ["trainer"], "trainer.total_step"),
    ("trainer.total_steps", "ten", ["trainer", "total_steps"], "trainer.total_steps"),
    ("trainer.total_steps", None, ["trainer", "total_steps"], "trainer.total_steps"),
    ("trainer.total_steps", 0, ["trainer", "total_steps"], "trainer.total_steps"),
    ("ray.backend", "slurm", ["ray", "backend"], "ray.backend"),
    ("rollout.top_p", 1.5, ["rollout", "top_p"], "rollout.top_p"),
    ("roles.actor.optim.betas", [0.9], ["roles", "actor", "optim", "betas"], "roles.actor.optim.betas"),
    ("roles.actor.optim.betas", [0.9, 1.0], ["roles", "actor", "optim", "betas", 1], "roles.actor.optim.betas[1]"),
    ("roles.judge", {"worker": "x.Y"}, ["roles"], "roles.judge"),
    ("resource_pools.main.process_on_nodes", [0], ["resource_pools", "main", "process_on_nodes", 0],
     "resource_pools.main.process_on_nodes[0]"),
    ("resource_pools.main.gpus", 1, ["resource_pools", "main"], "resource_pools.main.gpus"),
    ("roles.actor.lora", {"target_modules": []}, ["roles", "actor", "lora", "target_modules"],
     "roles.actor.lora.target_modules"),
    ("trainer.save_on_interrupt", "yes", ["trainer", "save_on_interrupt"], "trainer.save_on_interrupt"),
]


@pytest.mark.parametrize("path,value,schema_path,key_path", REJECTED, ids=[f"{case[0]}={case[1]!r}" for case in REJECTED])
def test_what_the_loader_rejects_the_schema_rejects_at_the_same_key(validator, path, value, schema_path, key_path):
    data = _at(path, value, QUICKSTART)
    with pytest.raises(RecipeError) as caught:
        recipe_from_dict(copy.deepcopy(data))
    assert caught.value.key_path == key_path
    errors = _errors(validator, data)
    assert errors and [where for where, _ in errors] == [schema_path], errors


def test_a_misspelled_key_and_a_wrong_type_name_the_key(validator):
    errors = _errors(validator, _at("trainer.total_step", 10, _at("trainer.total_steps", "ten", QUICKSTART)))
    assert sorted(errors) == [
        (["trainer"], "Additional properties are not allowed ('total_step' was unexpected)"),
        (["trainer", "total_steps"], f"'ten' does not match {PLACEHOLDER_PATTERN!r}"),  # a string that is no ${...}
    ]
    editor_message = recipe_json_schema()["properties"]["trainer"]["properties"]["total_steps"]["patternErrorMessage"]
    assert editor_message.startswith("expected an integer;")  # what the YAML language server shows instead


ACCEPTED = [
    ("trainer.mini_batch_size", "${trainer.batch_size}"),  # an interpolation in an integer key
    ("roles.critic", None),  # a nullable section
    ("roles.actor.lora", {"r": 4, "target_modules": ["q_proj", "v_proj"]}),
    ("roles.actor.model.config.rope_theta", 10000.0),  # an inline config takes any transformers key
    ("roles.reward.function_kwargs", {"method": "flexible"}),
    ("resource_pools.rollout", {"process_on_nodes": [1, 1]}),  # any pool name
    ("rollout.multi_turn.tools", [{"class": "rlhfctl.agents.tools:Calculator", "config": {}}]),
    ("trainer.call_timeout_s", 60),  # an integer where a number is expected
    ("roles.actor.model.dtype", "bf16"),
]


@pytest.mark.parametrize("path,value", ACCEPTED, ids=[case[0] for case in ACCEPTED])
def test_what_the_loader_accepts_the_schema_accepts(validator, path, value):
    data = _at(path, value, QUICKSTART)
    recipe_from_dict(copy.deepcopy(data))
    assert _errors(validator, data) == []


def test_a_required_marker_passes_the_schema_anywhere(validator):
    # a template's ??? is given by a later layer (an override): well formed in the file
    data = _at("trainer.total_steps", "???", _at("roles.actor.model.path", "???", QUICKSTART))
    assert _errors(validator, data) == []
    assert _errors(validator, _at("ray.backend", "???", QUICKSTART)) == []


@pytest.mark.parametrize("text", ["???", "${a}", "${oc.env:STEPS}", "x${a}", "?", "????", "$a", "{a}", "ten", ""])
def test_the_placeholder_pattern_is_the_loaders_rule(text):
    import re

    assert bool(re.search(PLACEHOLDER_PATTERN, text)) == is_placeholder(text)


# ---------------------------------------------------------------------------------- recipes copy
def test_copy_writes_the_schema_its_first_line_names(runner, tmp_path):
    target = tmp_path / "project" / "my-recipe.yaml"
    result = runner.invoke(app, ["recipes", "copy", "quickstart", str(target)])
    assert result.exit_code == 0, result.output
    text = target.read_text(encoding="utf-8")
    assert text.startswith(MODELINE + "\n") and text == find_bundled("quickstart").path.read_text(encoding="utf-8")
    schema = target.parent / modeline_target(text)
    assert schema == tmp_path / "project" / SCHEMA_FILE_NAME and schema.read_text(encoding="utf-8") == render_json_schema()
    assert "wrote" in result.stdout
    assert read_recipe_file(target)["trainer"]["total_steps"] == 40  # the comment line changes nothing


def test_copy_refreshes_an_older_rlhfctl_schema_and_leaves_a_foreign_one(runner, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / SCHEMA_FILE_NAME).write_text(json.dumps({"title": "rlhfctl recipe", "properties": {}}))
    assert runner.invoke(app, ["recipes", "copy", "ppo-gae", str(old) + "/"]).exit_code == 0
    assert (old / SCHEMA_FILE_NAME).read_text(encoding="utf-8") == render_json_schema()

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / SCHEMA_FILE_NAME).write_text('{"title": "something else"}')
    result = runner.invoke(app, ["recipes", "copy", "ppo-gae", str(foreign) + "/"])
    assert result.exit_code == 0 and "left" in result.stderr
    assert (foreign / SCHEMA_FILE_NAME).read_text() == '{"title": "something else"}'
    assert (foreign / "ppo-gae.yaml").exists()


def test_copying_a_pipeline_file_writes_no_schema(runner, tmp_path):
    assert runner.invoke(app, ["recipes", "copy", "pipeline-quickstart", str(tmp_path) + "/"]).exit_code == 0
    assert not (tmp_path / SCHEMA_FILE_NAME).exists()


def test_write_schema_beside_ignores_urls_and_absolute_paths(tmp_path):
    recipe = tmp_path / "r.yaml"
    for line in ("# yaml-language-server: $schema=https://example.org/recipe.schema.json",
                 f"# yaml-language-server: $schema={tmp_path / 'abs.json'}", "# just a comment"):
        recipe.write_text(line + "\ntrainer: {total_steps: 1}\n")
        assert write_schema_beside(recipe) == (None, False)
    assert list(tmp_path.iterdir()) == [recipe]


def test_the_description_skips_the_editor_line(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(f"{MODELINE}\n# My recipe.\ntrainer: {{total_steps: 1}}\n")
    assert recipe_description(recipe) == "My recipe."
