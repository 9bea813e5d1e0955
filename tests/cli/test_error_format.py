"""One error format everywhere, through the real ``rlhfctl`` command: ``error: <key or option>: <what is wrong>``
on one line of stderr, exit 2, no traceback, no boxed usage panel, and nothing printed before it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def rlhfctl(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "rlhfctl.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def one_line_error(done: subprocess.CompletedProcess, starts: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(starts), lines[0]
    assert "Traceback" not in done.stderr and "╭" not in done.stderr and "Usage:" not in done.stderr
    return lines[0]


@pytest.mark.parametrize("args, starts, says", [
    (("inspect-dispatch", "--trace", "{empty}"), "error: --trace: ", "trace.json not found"),
    (("inspect-dispatch", "quickstart", "--format", "xml"), "error: --format: ", "'xml' is not one of"),
    (("train", "quickstart", "--bogus"), "error: No such option: --bogus", "rlhfctl train -h"),
    (("validate",), "error: Missing argument 'recipe'", "rlhfctl validate -h"),
    (("no-such-command",), "error: No such command 'no-such-command'", "rlhfctl -h"),
])
def test_usage_errors_are_one_line_with_exit_2(tmp_path, args, starts, says):
    args = tuple(str(tmp_path) if arg == "{empty}" else arg for arg in args)
    assert says in one_line_error(rlhfctl(*args), starts)


def test_a_used_output_dir_is_refused_before_anything_is_printed(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    done = rlhfctl("train", "quickstart", f"trainer.output_dir={tmp_path}")
    line = one_line_error(done, "error: trainer.output_dir: ")
    assert "already holds a run" in line and "trainer.resume=auto" in line
    assert done.stdout == ""  # the run header comes after the check, not before it
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_help_still_prints_and_exits_0():
    done = rlhfctl()
    assert done.returncode == 0 and "train" in done.stdout + done.stderr
