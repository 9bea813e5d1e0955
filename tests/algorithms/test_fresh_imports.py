"""Each estimator name of ``rlhfctl.algorithms`` loads as the first thing a fresh interpreter asks for.

The package exports lazily, so the first name asked for decides the import order; ``gae_advantages`` first used
to meet ``advantages`` half-initialized through the registry (an ImportError on ``GroupIndex``). A test process
has imported everything already, so each name is tried in a new interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

FIRST_NAMES = ["gae_advantages", "grpo_advantages", "rloo_advantages", "remax_advantages", "reinforce_pp_advantages",
               "grpo_passk_advantages", "gdpo_advantages", "compute_advantages", "ADVANTAGE_ESTIMATORS"]


def test_every_estimator_name_loads_first_in_a_fresh_interpreter():
    code = ("import subprocess, sys\n"
            "for name in sys.argv[1:]:\n"
            "    done = subprocess.run([sys.executable, '-c', f'import rlhfctl.algorithms as a; a.{name}'],\n"
            "                          capture_output=True, text=True)\n"
            "    print(name, done.returncode, done.stderr.strip().splitlines()[-1:] )\n")
    done = subprocess.run([sys.executable, "-c", code, *FIRST_NAMES], capture_output=True, text=True, timeout=600)
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == FIRST_NAMES, done.stderr
    failed = [line for line in lines if line.split()[1] != "0"]
    assert failed == []


@pytest.mark.parametrize("name", ["gae_advantages"])
def test_the_estimators_register_whichever_module_loads_first(name):
    code = f"import rlhfctl.algorithms as a; a.{name}; print(sorted(a.ADVANTAGE_ESTIMATORS))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert {"gae", "grpo", "rloo", "remax", "grpo_passk", "opo", "gpg", "gdpo"} <= set(ast.literal_eval(done.stdout))
