"""Tools bundled with rlhfctl: a ``calculator`` and a ``python`` sandbox, usable as ``rollout.multi_turn.tools``."""

from rlhfctl.agents.tools.calculator import Calculator
from rlhfctl.agents.tools.python_sandbox import PythonSandbox

__all__ = ["Calculator", "PythonSandbox"]
