"""validate warns about restarts that would start from step 0, and about a call timeout under a measured step."""

from __future__ import annotations

import json
from pathlib import Path

from rlhfctl.recipe import load_recipe, validate_recipe
from rlhfctl.recipe.check_restarts import check_restarts
from rlhfctl.recipe.resolved import resolve

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"


def _warnings(*overrides: str) -> dict[str, str]:
    issues = check_restarts(resolve(load_recipe(QUICKSTART, list(overrides))))
    return {issue.key_path: issue.message for issue in issues if issue.severity == "warning"}


def test_max_restarts_without_save_every_warns_that_each_restart_starts_from_step_0(tmp_path):
    warnings = _warnings(f"trainer.output_dir={tmp_path}", "trainer.max_restarts=2")
    assert "starts the run again from step 0" in warnings["trainer.save_every"]
    assert _warnings(f"trainer.output_dir={tmp_path}", "trainer.max_restarts=2", "trainer.save_every=5") == {}
    assert _warnings(f"trainer.output_dir={tmp_path}") == {}  # no restarts asked: nothing to say


def test_a_call_timeout_under_a_step_the_resumed_run_measured_warns(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time/step": t}) + "\n"
                                                    for s, t in ((1, 4.0), (2, 9.5))) + '{"step": 3, "time/st')
    resumed = [f"trainer.output_dir={tmp_path}", "trainer.resume=auto"]
    message = _warnings(*resumed, "trainer.call_timeout_s=5")["trainer.call_timeout_s"]
    assert "5 s is shorter than a step of this run took (9.5 s" in message
    assert "trainer.call_timeout_s" not in _warnings(*resumed, "trainer.call_timeout_s=30")
    assert "trainer.call_timeout_s" not in _warnings(f"trainer.output_dir={tmp_path}", "trainer.call_timeout_s=5")


def test_validate_reports_the_restart_warnings(tmp_path):
    report = validate_recipe(load_recipe(QUICKSTART, [f"trainer.output_dir={tmp_path}", "trainer.max_restarts=1"]))
    assert any(issue.key_path == "trainer.save_every" for issue in report.issues if issue.severity == "warning")
