"""Every recipe error class exits 2 with one message naming the key path and no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlhfctl.cli import app
from tests.recipe.builders import recipe_data, write_recipe

REPO = Path(__file__).resolve().parents[2]


def _invoke(runner, *args):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    return result


@pytest.mark.parametrize("command", ["train", "validate", "inspect-dispatch"])
@pytest.mark.parametrize("override, key", [
    ("trainer.total_step=3", "trainer.total_step"),          # unknown key
    ("trainer.batch_size=abc", "trainer.batch_size"),        # wrong type
    ("trainer.total_steps=null", "trainer.total_steps"),     # missing required value
    ("ray.backend=slurm", "ray.backend"),                    # bad enum
])
def test_load_errors_exit_2_naming_the_key(runner, recipe_file, command, override, key):
    result = _invoke(runner, command, str(recipe_file), override)
    assert result.exit_code == 2
    assert key in result.stderr and "error:" in result.stderr


def test_unknown_key_message_suggests(runner, recipe_file):
    result = _invoke(runner, "validate", str(recipe_file), "trainer.total_step=3")
    assert "did you mean 'trainer.total_steps'" in result.stderr


def test_bad_enum_message_lists_choices(runner, recipe_file):
    assert "is not one of: ray, local" in _invoke(runner, "validate", str(recipe_file), "ray.backend=slurm").stderr


def test_yaml_syntax_error_names_file_and_line(runner, tmp_path):
    path = write_recipe(tmp_path, "trainer:\n  total_steps: [1, 2\nroles: {}\n")
    result = _invoke(runner, "validate", str(path))
    assert result.exit_code == 2 and f"{path}:" in result.stderr and "YAML syntax error" in result.stderr


def test_missing_recipe_file(runner, tmp_path):
    result = _invoke(runner, "train", str(tmp_path / "absent.yaml"))
    assert result.exit_code == 2 and "recipe file not found" in result.stderr


@pytest.mark.parametrize("override, key", [
    ("roles.actor.worker=no_such_module.Actor", "roles.actor.worker"),
    ("roles.reward.function=rlhfctl.tasks.digits:nope", "roles.reward.function"),
    ("data.train_files=[absent.jsonl]", "data.train_files[0]"),
    ("roles.reward.pool=elsewhere", "roles.reward.pool"),
])
def test_validation_errors_exit_2_in_train_and_validate(runner, recipe_file, override, key):
    for command in ("train", "validate"):
        result = _invoke(runner, command, str(recipe_file), override)
        assert result.exit_code == 2 and key in result.stderr


def test_inspect_dispatch_worker_import_error(runner, recipe_file):
    result = _invoke(runner, "inspect-dispatch", str(recipe_file), "roles.critic.worker=nowhere.Critic")
    assert result.exit_code == 2 and "roles.critic.worker" in result.stderr


def test_gae_without_critic(runner, recipe_file):
    result = _invoke(runner, "validate", str(recipe_file), "algorithm.adv_estimator=gae")
    assert result.exit_code == 2 and "algorithm.adv_estimator" in result.stderr


def test_subprocess_user_error_has_no_traceback(tmp_path):
    path = write_recipe(tmp_path, recipe_data())
    result = subprocess.run([sys.executable, "-m", "rlhfctl.cli", "train", str(path), "trainer.totl_steps=3"],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2
    assert "trainer.totl_steps" in result.stderr and "did you mean 'trainer.total_steps'" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_subprocess_validate_ok_and_version(tmp_path):
    path = write_recipe(tmp_path, recipe_data())
    result = subprocess.run([sys.executable, "-m", "rlhfctl.cli", "validate", str(path), "--format", "json"],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert '"ok": true' in result.stdout
    version = subprocess.run([sys.executable, "-m", "rlhfctl.cli", "--version"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == "rlhfctl 0.1.0"
