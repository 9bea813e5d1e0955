"""The three reporters and make_reporter."""

from __future__ import annotations

import io

from rich.console import Console

from rlhfctl.cli.reporters import PlainReporter, QuietReporter, RichReporter, make_reporter
from rlhfctl.single_controller import DispatchEvent
from rlhfctl.trainer.reporting import Reporter


def _drive(reporter) -> None:
    with reporter:
        reporter.run_started({"output_dir": "runs/x", "total_steps": 2, "roles": {"actor": 2}})
        for step in (1, 2):
            reporter.step_started(step, 2)
            event = DispatchEvent("reward", "compute_rewards", "ALL_TO_ALL", "ALL", [0, 1, 2], [22, 22, 22], started=0.0)
            reporter.dispatch_started(event)
            event.finished = 0.5
            reporter.dispatch_finished(event)
            reporter.step_finished(step, {"reward/mean": 0.25, "kl": 0.001, "actor/pg_loss": 0.5, "critic/vf_loss": 2.0,
                                          "response_length/mean": 12.0, "time/step": 3.0, "other": 9})
        reporter.message("saved checkpoint", level="info")
        reporter.message("something broke", level="error")
        reporter.run_finished({"steps": 2, "reward/last_mean": 0.25, "trace": {"calls": 3}})


def test_rich_reporter_renders_progress_and_metrics():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=120, color_system=None)
    reporter = make_reporter(False, console)
    assert isinstance(reporter, RichReporter) and isinstance(reporter, Reporter)
    _drive(reporter)
    out = stream.getvalue()
    assert "step 2/2" in out and "reward 0.25" in out and "vf_loss 2" in out and "resp_len 12" in out
    assert "saved checkpoint" in out and "error: something broke" in out and "run finished" in out
    assert reporter.live is None  # stopped


def test_rich_reporter_shows_dispatches_in_flight():
    console = Console(file=io.StringIO(), force_terminal=True, width=120, color_system=None)
    reporter = RichReporter(console)
    event = DispatchEvent("actor", "generate_sequences", "ALL_TO_ALL", "ALL", [0, 1], [8, 8], started=0.0)
    reporter.call_started(event)  # works as a worker-group observer too
    rendered = Console(file=io.StringIO(), width=120, color_system=None)
    rendered.print(reporter._render())
    assert "actor.generate_sequences" in rendered.file.getvalue() and "0-1" in rendered.file.getvalue()
    reporter.call_finished(event)
    assert reporter.inflight == {}
    reporter.close()


def test_plain_reporter_lines():
    stream = io.StringIO()
    _drive(PlainReporter(stream))
    lines = stream.getvalue().splitlines()
    assert lines[0] == "run started: output_dir=runs/x total_steps=2 roles=actor:2"
    assert "step 1/2  reward=0.25 kl=0.001 pg_loss=0.5 vf_loss=2 resp_len=12 step_s=3" in lines
    assert "error: something broke" in lines
    assert lines[-3:] == ["run finished", "  steps: 2", "  reward/last_mean: 0.25"]
    assert not any("compute_rewards" in line for line in lines)


def test_plain_reporter_verbose_dispatch_lines():
    stream = io.StringIO()
    _drive(PlainReporter(stream, verbose=True))
    out = stream.getvalue()
    assert "-> reward.compute_rewards ALL_TO_ALL ranks=0-2 rows/rank=22" in out and "<- reward.compute_rewards 0.50s" in out


def test_quiet_reporter_only_errors(capsys):
    _drive(QuietReporter(Console(stderr=True)))
    captured = capsys.readouterr()
    assert captured.out == "" and "something broke" in captured.err and "saved" not in captured.err


def test_make_reporter_choices():
    plain_console = Console(file=io.StringIO())
    assert isinstance(make_reporter(False, plain_console), PlainReporter)
    assert isinstance(make_reporter(True, plain_console), QuietReporter)
