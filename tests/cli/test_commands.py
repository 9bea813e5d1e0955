"""validate, inspect-dispatch and recipes through CliRunner; --version and --help everywhere."""

from __future__ import annotations

import json

import pytest

from rlhfctl.cli import app


def _json(result) -> dict:
    assert result.exit_code in (0, 2), result.output
    return json.loads(result.stdout)


def test_version(runner):
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == "rlhfctl 0.1.0"


@pytest.mark.parametrize("command", [[], ["train"], ["validate"], ["inspect-dispatch"], ["recipes"],
                                     ["recipes", "list"], ["recipes", "show"], ["recipes", "copy"]])
def test_help_everywhere_with_examples(runner, command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    if command and command != ["recipes"]:
        assert "rlhfctl" in result.stdout and "Example" in result.stdout


def test_validate_table_for_two_ranks(runner, recipe_file):
    result = runner.invoke(app, ["validate", str(recipe_file), "trainer.mini_batch_size=8", "roles.actor.micro_batch_size=4"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "16 prompts (trainer.batch_size) x n=4 (rollout.n) = 64 samples" in out
    assert "per epoch: 512 training prompts = 32 steps of 16" in out
    assert "actor.generate_sequences" in out and "reward.compute_rewards" in out
    assert "recipe is valid" in out


def test_validate_json_numbers_two_and_three_ranks(runner, recipe_file):
    two = _json(runner.invoke(app, ["validate", str(recipe_file), "trainer.mini_batch_size=8", "--format", "json"]))
    shards = {row["call"]: row for row in two["batch"]["shards"]}
    assert two["ok"] is True
    assert shards["reward.compute_rewards"]["rows_per_rank"] == 32 and shards["reward.compute_rewards"]["padding"] == 0
    assert two["batch"]["updates"][0]["mini_batches"] == 2 and two["batch"]["updates"][0]["mini_batch_rows_per_rank"] == 16

    result = runner.invoke(app, ["validate", str(recipe_file), "resource_pools.main.process_on_nodes=[3]", "--format", "json"])
    assert result.exit_code == 2
    three = json.loads(result.stdout)
    shards = {row["call"]: row for row in three["batch"]["shards"]}
    assert (shards["reward.compute_rewards"]["rows_per_rank"], shards["reward.compute_rewards"]["padding"]) == (22, 2)
    assert (shards["actor.generate_sequences"]["rows_per_rank"], shards["actor.generate_sequences"]["padding"]) == (6, 2)
    assert [e["key_path"] for e in three["errors"]] == ["trainer.mini_batch_size"]


def test_validate_table_flags_non_dividing_sizes(runner, recipe_file):
    result = runner.invoke(app, ["validate", str(recipe_file), "resource_pools.main.process_on_nodes=[3]"])
    assert result.exit_code == 2
    assert "does not split evenly over 3 ranks" in result.stderr
    assert "22" in result.stdout and "recipe has 1 error" in result.stderr


def test_validate_batch_size_option(runner, recipe_file):
    data = _json(runner.invoke(app, ["validate", str(recipe_file), "--batch-size", "8", "trainer.mini_batch_size=8", "--format", "json"]))
    assert data["batch"]["prompts_per_step"] == 8 and data["batch"]["samples_per_step"] == 32


def test_inspect_dispatch_json(runner, recipe_file):
    # Three reward ranks pad 64 samples; the actor keeps two ranks, which its mini-batch divides (else exit 2).
    plan = _json(runner.invoke(app, ["inspect-dispatch", str(recipe_file), "resource_pools.score={process_on_nodes: [3]}",
                                     "roles.reward.pool=score", "ray.num_cpus=4", "--format", "json"]))
    assert set(plan) >= {"roles", "dataflow", "batch", "pools", "format_version"}
    assert plan["roles"]["reward"]["methods"]["compute_rewards"]["dispatch_mode"] == "ALL_TO_ALL"
    assert plan["roles"]["actor"]["colocated_with"] == ["reference"]
    reward = next(e for e in plan["dataflow"] if e["call"] == "reward.compute_rewards")
    assert reward["padding_rows"] == 2 and reward["rows_per_rank"] == 22 and reward["pool"] == "score"
    assert {t["name"]: t["shape"] for t in reward["inputs"]}["responses"] == [22, 32]
    generate = plan["dataflow"][0]
    assert generate["summary"] == "16 prompts -> 2 ranks x 8 (-> 64 samples)" and generate["pool"] == "main"


def test_inspect_dispatch_filters(runner, recipe_file):
    plan = _json(runner.invoke(app, ["inspect-dispatch", str(recipe_file), "--role", "actor", "--format", "json"]))
    assert list(plan["roles"]) == ["actor"] and {e["role"] for e in plan["dataflow"]} == {"actor"}
    plan = _json(runner.invoke(app, ["inspect-dispatch", str(recipe_file), "--method", "compute_ref_log_prob", "--format", "json"]))
    assert [e["call"] for e in plan["dataflow"]] == ["reference.compute_ref_log_prob"]
    assert set(plan["roles"]) == {"actor", "reference"}  # the stub actor registers it too
    plan = _json(runner.invoke(app, ["inspect-dispatch", str(recipe_file), "--role", "driver", "--format", "json"]))
    assert [e["kind"] for e in plan["dataflow"]] == ["driver"]


@pytest.mark.parametrize("args, word", [(["--role", "critic"], "not in this recipe"), (["--role", "judge"], "roles here"),
                                        (["--method", "generate"], "did you mean")])
def test_inspect_dispatch_bad_filters_exit_2(runner, recipe_file, args, word):
    result = runner.invoke(app, ["inspect-dispatch", str(recipe_file), *args])
    flat = " ".join(result.output.replace("│", " ").split())  # usage errors are shown in a wrapped panel
    assert result.exit_code == 2 and word in flat


def test_inspect_dispatch_table_with_lora_reference(runner, recipe_file):
    result = runner.invoke(app, ["inspect-dispatch", str(recipe_file), "roles.actor.lora={r: 4}", "~roles.reference"])
    assert result.exit_code == 0, result.output
    assert "actor.compute_ref_log_prob" in result.stdout and "reference.compute_ref_log_prob" not in result.stdout
    assert "16 prompts -> 2 ranks x 8 (-> 64 samples)" in result.stdout
    assert "responses (32, 32) int64" in result.stdout


def test_recipes_list_show_copy(runner, tmp_path):
    listed = runner.invoke(app, ["recipes", "list"])
    assert listed.exit_code == 0 and "quickstart" in listed.stdout and "GRPO" in listed.stdout
    shown = runner.invoke(app, ["recipes", "show", "quickstart"])
    assert shown.exit_code == 0 and "adv_estimator: grpo" in shown.stdout
    assert runner.invoke(app, ["recipes", "show", "nope"]).exit_code == 2
    target = tmp_path / "mine.yaml"
    assert runner.invoke(app, ["recipes", "copy", "quickstart", str(target)]).exit_code == 0
    target.write_text("edited")
    refused = runner.invoke(app, ["recipes", "copy", "quickstart", str(target)])
    assert refused.exit_code == 2 and "--force" in refused.stderr and target.read_text() == "edited"
    assert runner.invoke(app, ["recipes", "copy", "quickstart", str(target), "--force"]).exit_code == 0
    assert "adv_estimator: grpo" in target.read_text()


def test_a_bundled_name_works_as_recipe(runner):
    data = _json(runner.invoke(app, ["validate", "quickstart", "--format", "json"]))
    assert data["recipe"].endswith("quickstart.yaml")


def test_validate_names_the_partial_batch_each_epoch_leaves_out(runner, recipe_file):
    result = runner.invoke(app, ["validate", str(recipe_file), "data.num_train=50", "trainer.batch_size=8",
                                 "trainer.mini_batch_size=8"], terminal_width=250)
    assert result.exit_code == 0, result.output
    assert ("per epoch: 50 training prompts = 6 steps of 8; the last 2 prompts of each epoch (a partial batch) "
            "are left out") in " ".join(result.stdout.split())
    data = _json(runner.invoke(app, ["validate", str(recipe_file), "data.num_train=50", "trainer.batch_size=8",
                                     "trainer.mini_batch_size=8", "--format", "json"]))
    assert data["batch"]["epoch"] == {"prompts": 50, "steps_per_epoch": 6, "dropped_per_epoch": 2, "shuffled": True}
