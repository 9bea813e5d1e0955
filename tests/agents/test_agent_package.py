"""The public names of rlhfctl.agents, imported on first use: importing the package pulls in no torch."""

from __future__ import annotations

import subprocess
import sys

import rlhfctl.agents as agents


def test_every_public_name_resolves():
    for name in agents.__all__:
        assert getattr(agents, name) is not None, name


def test_importing_the_package_and_the_tool_base_loads_no_torch():
    code = "import sys, rlhfctl.agents as a; a.Tool; a.ToolResult; a.Environment; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
