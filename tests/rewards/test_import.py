"""Importing rlhfctl.rewards stays light: no torch, transformers, ray (nor math-verify) until a reward needs it."""

from __future__ import annotations

import subprocess
import sys

import rlhfctl.rewards


def test_import_brings_in_no_heavy_package():
    code = (
        "import sys, rlhfctl.rewards\n"
        "heavy = [name for name in ('torch', 'transformers', 'ray', 'math_verify', 'sympy', 'workers') if name in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == ""


def test_recipes_reach_each_reward_as_an_attribute_of_the_package():
    for name in ("gsm8k", "math", "format", "dispatch_by_source", "combined", "math_backend"):
        assert callable(getattr(rlhfctl.rewards, name)), name
    assert rlhfctl.rewards.math.__module__ == "rlhfctl.rewards.math_answers"
