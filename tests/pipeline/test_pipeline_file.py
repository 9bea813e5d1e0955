"""Pipeline files: loading, ${stages.<name>.<attribute>} references, overrides, and the errors they give."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlhfctl.pipeline import PipelineError, load_pipeline, pipeline_from_dict, plan_stages

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
QUICKSTART = RECIPES / "pipeline-quickstart.yaml"


def two_stages(**ppo_stage) -> dict:
    return {"output_dir": "runs/x", "stages": [
        {"name": "sft", "recipe": "sft-quickstart"},
        {"name": "ppo", "recipe": "quickstart", **ppo_stage},
    ]}


def error_of(data: dict, overrides: list[str] = ()) -> PipelineError:
    with pytest.raises(PipelineError) as caught:
        pipeline_from_dict(data, overrides, base_dir=RECIPES)
    return caught.value


def test_the_quickstart_pipeline_loads_with_its_recipes_next_to_it(tmp_path):
    spec = load_pipeline(QUICKSTART, [f"output_dir={tmp_path}", "ppo.trainer.total_steps=3"])
    assert spec.names() == ["sft", "reward", "ppo"] and spec.output_dir == tmp_path
    assert spec.stages[0].recipe_path == RECIPES / "sft-quickstart.yaml"
    assert spec.stages[2].overrides[-1] == "trainer.total_steps=3"


def test_plans_substitute_earlier_outputs_and_own_the_output_dir(tmp_path):
    plans = plan_stages(load_pipeline(QUICKSTART, [f"output_dir={tmp_path}"]))  # the sft model does not exist yet
    sft, reward, ppo = plans
    assert [plan.algorithm for plan in plans] == ["sft", "reward_model", "ppo"]
    assert reward.cfg.roles.reward.model.path == str(tmp_path / "sft" / "model")
    assert ppo.cfg.roles.actor.model.path == str(tmp_path / "sft" / "model") and ppo.cfg.roles.actor.model.config is None
    assert ppo.cfg.roles.reward.model.path == str(tmp_path / "reward" / "model") and ppo.cfg.roles.reward.function is None
    assert ppo.cfg.trainer.output_dir == str(tmp_path / "ppo") and ppo.cfg.trainer.export_hf is True
    assert sft.fingerprint != reward.fingerprint


def test_mapping_overrides_read_like_the_list_form():
    spec = pipeline_from_dict(two_stages(overrides={"roles.actor.model.path": "${stages.sft.output}", "trainer.total_steps": 3}),
                              base_dir=RECIPES)
    assert spec.stages[1].overrides == ['roles.actor.model.path="${stages.sft.output}"', "trainer.total_steps=3"]


def test_an_unknown_stage_reference_names_the_stage_and_the_key():
    error = error_of(two_stages(overrides=["trainer.total_steps=3", "roles.actor.model.path=${stages.sfft.output}"]))
    assert error.key_path == "stages.ppo.overrides[1]"
    assert str(error) == (
        "stages.ppo.overrides[1]: ${stages.sfft.output} refers to unknown stage 'sfft'; did you mean 'sft'? "
        "(stages: sft, ppo)"
    )


@pytest.mark.parametrize("reference, words", [
    ("${stages.ppo.output}", "refers to stage 'ppo' itself"),
    ("${stages.sft.model}", "unknown attribute 'model' (use output, dir, metrics)"),
])
def test_bad_references(reference, words):
    assert words in str(error_of(two_stages(overrides=[f"roles.actor.model.path={reference}"])))


def test_a_reference_to_a_later_stage_is_refused():
    data = two_stages()
    data["stages"][0]["overrides"] = ["roles.actor.model.path=${stages.ppo.output}"]
    assert "refers to stage 'ppo', which runs after 'sft'" in str(error_of(data))


def test_inline_recipes_are_checked_for_references_too():
    data = two_stages()
    data["stages"][1]["recipe"] = {"roles": {"actor": {"model": {"path": "${stages.nope.output}"}}}}
    error = error_of(data)
    assert error.key_path == "stages.ppo.recipe.roles.actor.model.path" and "unknown stage 'nope'" in str(error)


@pytest.mark.parametrize("data, overrides, words", [
    ({"output_dir": "x", "stage": []}, [], "unknown key 'stage'; did you mean 'stages'?"),
    ({"stages": []}, [], "stages must be a non-empty list"),
    ({"stages": [{"name": "a", "recipe": "quickstart"}, {"name": "a", "recipe": "quickstart"}]}, [], "two stages are named 'a'"),
    ({"stages": [{"name": "a", "recipe": "nowhere.yaml"}]}, [], "stages.a.recipe: recipe file not found: nowhere.yaml"),
    ({"stages": [{"name": "a", "recipe": "quickstart", "override": []}]}, [], "unknown key 'override'; did you mean 'overrides'?"),
    ({"stages": [{"name": "1st", "recipe": "quickstart"}]}, [], "stages[0].name: a stage needs a name"),
    (two_stages(), ["sfft.trainer.total_steps=3"], "with a stage of: sft, ppo; did you mean 'sft'?"),
    (two_stages(), ["trainer.total_steps=3"], "expected output_dir=DIR or <stage>.<recipe key>=value"),
])
def test_file_and_override_errors(data, overrides, words):
    assert words in str(error_of(data, overrides))


def test_a_bad_key_in_a_later_stage_stops_the_run_before_anything_trains(tmp_path):
    spec = load_pipeline(QUICKSTART, [f"output_dir={tmp_path}", "ppo.trainer.total_stepz=3"])
    with pytest.raises(PipelineError) as caught:
        plan_stages(spec)
    assert caught.value.key_path == "stages.ppo.trainer.total_stepz"
    assert str(caught.value).startswith("stages.ppo (") and "did you mean 'trainer.total_steps'" in str(caught.value)
    assert not (tmp_path / "sft").exists()


def test_a_validation_error_names_the_stage(tmp_path):
    spec = load_pipeline(QUICKSTART, [f"output_dir={tmp_path}", "reward.roles.reward.worker=workers.reward.RewardWorker"])
    with pytest.raises(PipelineError, match=r"stages.reward .*lacks registered method\(s\) train_reward_model"):
        plan_stages(spec)


def test_the_cli_reports_pipeline_errors_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from rlhfctl.cli import app

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(two_stages(overrides=["roles.actor.model.path=${stages.sfft.output}"])))
    (tmp_path / "sft-quickstart.yaml").write_text((RECIPES / "sft-quickstart.yaml").read_text())
    result = CliRunner().invoke(app, ["pipeline", str(bad)])
    assert result.exit_code == 2
    assert "error: stages.ppo.overrides[0]: ${stages.sfft.output} refers to unknown stage 'sfft'" in result.stderr
    assert "Traceback" not in result.output
    helped = CliRunner().invoke(app, ["pipeline", "--help"])
    assert helped.exit_code == 0 and "Example" in helped.stdout and "rlhfctl pipeline" in helped.stdout


def test_training_a_pipeline_file_points_to_the_pipeline_command():
    from typer.testing import CliRunner

    from rlhfctl.cli import app

    result = CliRunner().invoke(app, ["train", str(QUICKSTART)])
    assert result.exit_code == 2 and "looks like a pipeline file: run rlhfctl pipeline" in result.stderr


def test_validate_checks_every_stage_of_a_pipeline_file():
    import json

    from typer.testing import CliRunner

    from rlhfctl.cli import app

    result = CliRunner().invoke(app, ["validate", str(QUICKSTART)])
    assert result.exit_code == 0, result.output
    assert "stage sft: sft" in result.stdout and "stage ppo: ppo" in result.stdout
    as_json = CliRunner().invoke(app, ["validate", str(QUICKSTART), "output_dir=/tmp/p", "--format", "json"])
    report = json.loads(as_json.stdout)
    assert report["ok"] and [stage["name"] for stage in report["stages"]] == ["sft", "reward", "ppo"]
    assert report["stages"][0]["output_dir"] == "/tmp/p/sft"
    bad = CliRunner().invoke(app, ["validate", str(QUICKSTART), "ppo.trainer.total_stepz=3"])
    assert bad.exit_code == 2
    assert "stages.ppo" in bad.stderr and "did you mean 'trainer.total_steps'" in bad.stderr
    assert "Traceback" not in bad.output

