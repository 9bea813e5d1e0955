"""docs/concepts.md: its runnable example runs as written, and every Python snippet parses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONCEPTS = ROOT / "docs" / "concepts.md"
FENCE = re.compile(r"^```python\n(.*?)^```\s*$", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[str]:
    return FENCE.findall(CONCEPTS.read_text(encoding="utf-8"))


def runnable_example() -> str:
    """The one ```python block that is a whole program (it has a ``__main__`` guard)."""
    examples = [block for block in python_blocks() if 'if __name__ == "__main__":' in block]
    assert len(examples) == 1, f"expected exactly one runnable example in {CONCEPTS.name}, found {len(examples)}"
    return examples[0]


def test_every_python_snippet_parses():
    blocks = python_blocks()
    assert len(blocks) >= 5
    for number, block in enumerate(blocks):
        compile(block, f"{CONCEPTS.name}[python block {number}]", "exec")


@pytest.mark.slow  # starts its own Ray and 5 worker processes: 30-75 s on a 2-core machine
def test_the_runnable_example_runs(tmp_path):
    script = tmp_path / "concepts_example.py"
    script.write_text(runnable_example(), encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}  # always a private Ray
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        done = subprocess.run(
            [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"the concepts example did not finish in 300 s; output so far:\n{error.stdout}\n{error.stderr}")
    output = f"--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr[-6000:]}"
    assert done.returncode == 0, output
    assert "concepts example: ok" in done.stdout, output
