"""Output off a terminal: no escape codes (Ray's coloured worker and raylet lines), and the end-of-run summary
names the command that plots the run."""

from __future__ import annotations

import io
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app
from rlhfctl.cli.console import make_console, show_library_output
from rlhfctl.cli.reporters import make_reporter
from rlhfctl.library_output import VERBOSE_VARIABLE, PlainStream, strip_ansi

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
RED = "\x1b[31m"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def streams(monkeypatch):
    """Returns a function that makes stdout and stderr what a log file would be (not terminals), in the test's
    body (pytest sets its own capture back between a fixture and the test); quiet_this_process left out (--verbose)."""
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv(VERBOSE_VARIABLE, "1")

    def logs() -> tuple[io.StringIO, io.StringIO]:
        out, err = io.StringIO(), io.StringIO()
        monkeypatch.setattr(sys, "stdout", out)
        monkeypatch.setattr(sys, "stderr", err)
        return out, err

    return logs


def test_strip_ansi_drops_colours_cursor_moves_and_titles():
    assert strip_ansi(f"{RED}error\x1b[0m \x1b[1;33m(raylet)\x1b[39m \x1b]0;title\x07ok\x1b[2K\x1b[1A") == "error (raylet) ok"


def test_a_ray_message_with_colour_codes_reaches_a_log_without_them(streams):
    out, err = streams()
    show_library_output(verbose=False)
    assert isinstance(sys.stdout, PlainStream) and isinstance(sys.stderr, PlainStream)
    # The plain reporter (stdout is not a terminal) showing a message that carries Ray's colours.
    reporter = make_reporter(False, make_console())
    reporter.message(f"{RED}(raylet) memory is low\x1b[0m", "warning")
    assert out.getvalue() == "warning: (raylet) memory is low\n"
    # A raylet line as Ray forwards it to the driver's stderr (log_to_driver): Ray colours its prefix itself.
    from ray._private.worker import print_to_stdstream

    text = f"{RED}[{uuid.uuid4().hex}] a worker was killed{chr(27)}[0m"  # unique: Ray deduplicates repeated lines
    print_to_stdstream({"pid": "raylet", "ip": "10.0.0.1", "localhost": "10.0.0.1", "is_err": True, "lines": [text]},
                       ignore_prefix=False)
    assert err.getvalue() == f"(raylet) {strip_ansi(text)}\n" and "\x1b" not in err.getvalue()


def test_a_terminal_and_force_color_keep_their_colours(monkeypatch, streams):
    _, err = streams()
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    show_library_output(verbose=False)
    assert sys.stdout is terminal and isinstance(sys.stderr, PlainStream)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("FORCE_COLOR", "1")
    show_library_output(verbose=False)
    print(f"{RED}red", file=sys.stderr)
    assert sys.stderr is err and err.getvalue() == f"{RED}red\n"


def test_the_summary_ends_with_the_plot_command(tmp_path):
    run = tmp_path / "my run"  # a space: the command is quoted for the shell
    result = CliRunner().invoke(app, [
        "train", str(RECIPES / "sft-quickstart.yaml"), "ray.backend=local", "trainer.total_steps=1", "data.num_train=16",
        "data.num_val=0", "trainer.val_every=0", "trainer.batch_size=8", f"trainer.output_dir={run}"])
    assert result.exit_code == 0, result.output
    summary = result.stdout[result.stdout.index("run finished"):].splitlines()
    assert summary[-1] == f"  plot: rlhfctl plot '{run}' --output '{run / 'metrics.png'}'"
    assert (run / "metrics.jsonl").is_file()
