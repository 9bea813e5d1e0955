"""validate stops a recipe whose python tool this host cannot confine (exit 2 naming allow_unconfined), and lets
it through, warned, when the recipe opts out; the refusal is the kernel's own, produced by a threaded launcher."""

from __future__ import annotations

import pytest

from rlhfctl.agents.tools import python_sandbox
from tests.agents.test_agent_recipes import ECHO, _validate, agent_recipe, workdir  # noqa: F401 - fixture
from tests.agents.test_python_sandbox import threaded_child  # noqa: F401 - fixture

PYTHON_TOOL = {"class": "rlhfctl.agents.tools:PythonSandbox", "config": {"timeout_s": 2}}
KEY = "rollout.multi_turn.tools[1].config.allow_unconfined"


def test_validate_exits_2_naming_allow_unconfined_where_the_kernel_refuses(workdir, threaded_child):  # noqa: F811
    result = _validate(agent_recipe(workdir, tools=[ECHO, PYTHON_TOOL]))
    assert result.exit_code == 2, result.output
    assert KEY in result.output
    assert "(unshare: Invalid argument)" in result.output


def test_allow_unconfined_passes_validate_with_a_warning(workdir, threaded_child):  # noqa: F811
    tool = {"class": PYTHON_TOOL["class"], "config": {"allow_unconfined": True}}
    result = _validate(agent_recipe(workdir, tools=[ECHO, tool]))
    assert result.exit_code == 0, result.output
    assert KEY in result.output and "resource limits only" in result.output


@pytest.mark.skipif(bool(python_sandbox.boundary_refusal()), reason="this kernel refuses the sandbox's namespaces")
def test_validate_passes_where_the_kernel_allows_the_boundary(workdir):  # noqa: F811
    result = _validate(agent_recipe(workdir, tools=[ECHO, PYTHON_TOOL]))
    assert result.exit_code == 0, result.output
    assert "allow_unconfined" not in result.output
