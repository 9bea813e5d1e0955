"""inspect-dispatch --trace: the summary of a recorded run."""

from __future__ import annotations

import json


def test_trace_mode_summarizes_a_run_directory(tmp_path):
    from typer.testing import CliRunner

    from rlhfctl.cli.app import app
    from rlhfctl.trace import TRACE_FILE

    trace = {"traceEvents": [
        {"name": "step 1", "cat": "step", "ph": "X", "pid": 0, "tid": 1, "ts": 0, "dur": 2e6, "args": {}},
        {"name": "actor.update_actor", "cat": "call", "ph": "X", "pid": 0, "tid": 0, "ts": 0, "dur": 1.5e6,
         "args": {"bytes_sent": 2_000_000}},
        {"name": "actor.update_actor", "cat": "worker", "ph": "X", "pid": 1, "tid": 0, "ts": 1e5, "dur": 1.2e6, "args": {}},
    ]}
    (tmp_path / TRACE_FILE).write_text(json.dumps(trace))
    runner = CliRunner()
    result = runner.invoke(app, ["inspect-dispatch", "--trace", str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["methods"]["actor.update_actor"]["calls"] == 1
    assert data["orchestration_share"] == 0.4
    table = runner.invoke(app, ["inspect-dispatch", "--trace", str(tmp_path)])
    assert table.exit_code == 0 and "actor.update_actor" in table.output and "orchestration" in table.output
    assert "by hand-over" in table.output and "actor.update_actor -> step end" in table.output
    assert data["idle_by_boundary"]["actor.update_actor -> step end"] == {"total_s": 0.7, "per_step_ms": 700.0}
    missing = runner.invoke(app, ["inspect-dispatch", "--trace", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "trainer.trace=true" in missing.output
