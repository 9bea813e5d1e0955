"""Mistakes are reported before the heavy imports: a key typo, a bad override value and a missing file exit 2
from ``validate`` and ``train`` with torch, transformers and Ray never imported (the time this saves is
measured by ``benchmarks/cli_latency.py``, not here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "ray")

PROBE = """
import json, sys
from rlhfctl.cli import main
sys.argv = ["rlhfctl", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as stop:
    code = stop.code
print(json.dumps({"code": code, "heavy": [name for name in %r if name in sys.modules]}))
""" % (HEAVY,)


@pytest.mark.parametrize("command", ["validate", "train"])
@pytest.mark.parametrize("override, key", [
    ("rollout.max_new_token=3", "rollout.max_new_token"),
    ("trainer.batch_size=abc", "trainer.batch_size"),
    ("data.train_files=[absent.jsonl]", "data.train_files[0]"),
    ("roles.actor.model.path=./no-such-model", "roles.actor.model.path"),
])
def test_a_mistake_exits_2_before_torch_transformers_or_ray_is_imported(command, override, key):
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps([command, "quickstart", override])],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 2, done.stderr
    assert key in done.stderr and "error:" in done.stderr
    assert result["heavy"] == [], f"{command} {override} imported {result['heavy']} before reporting"
