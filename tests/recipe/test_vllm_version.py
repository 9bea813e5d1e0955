"""rollout.engine: vllm with a vLLM older than the sync needs is exit 2 from validate and train, naming both
versions; pyproject.toml's bound is the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlhfctl.cli import app
from rlhfctl.rollout import vllm_engine

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "recipes" / "quickstart.yaml"


@pytest.mark.parametrize("command", ["validate", "train"])
def test_an_old_vllm_is_exit_2_naming_the_installed_and_the_needed_version(monkeypatch, command):
    from typer.testing import CliRunner

    monkeypatch.setattr(vllm_engine, "vllm_installed", lambda: True)
    monkeypatch.setattr(vllm_engine, "installed_vllm_version", lambda: "0.15.1")
    result = CliRunner().invoke(app, [command, str(QUICKSTART), "rollout.engine=vllm"])
    assert result.exit_code == 2, result.output
    assert "vLLM >= 0.16.0" in result.stderr and "vLLM 0.15.1 is installed" in result.stderr
    assert "Traceback" not in result.output


def test_pyproject_bounds_vllm_where_the_code_does():
    text = (REPO / "pyproject.toml").read_text()
    bound = re.search(r'vllm = \["vllm>=([0-9.]+)"\]', text).group(1)
    assert tuple(map(int, bound.split("."))) + (0,) * (3 - len(bound.split("."))) == vllm_engine._release(vllm_engine.VLLM_MIN_VERSION)
