"""``rlhfctl plot``: hand-written metrics.jsonl files of two runs drawn into a PNG and an SVG through the CLI;
the user errors (bad suffix, missing run, unknown metrics, no matplotlib) exit 2 naming the problem."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rlhfctl.cli import app
from rlhfctl.plotting.metrics_file import load_run, run_labels
from rlhfctl.plotting.panels import MetricSpec, choose_panels, match_keys

REPO = Path(__file__).resolve().parents[2]
KEYS = ["reward/mean", "actor/kl_loss", "actor/entropy", "response_length/mean", "time/generate",
        "time/update_actor", "time/step"]


def write_run(directory: Path, steps: int = 6, slope: float = 0.1, extra: dict | None = None) -> Path:
    """A run directory whose metrics.jsonl holds the keys a PPO-family run logs."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(1, steps + 1):
        record = {"step": step, "reward/mean": slope * step, "actor/kl_loss": 0.001 * step, "actor/entropy": 4.5 - 0.1 * step,
                  "response_length/mean": 20 + step, "time/generate": 1.0 + 0.01 * step, "time/update_actor": 1.5,
                  "time/step": 2.6, **(extra or {})}
        lines.append(json.dumps(record))
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    return write_run(tmp_path / "runA", slope=0.1), write_run(tmp_path / "runB", steps=4, slope=0.05, extra={"kl": 0.01})


def _plot(runner, *args: str):
    result = runner.invoke(app, ["plot", *args])
    assert "Traceback" not in result.output, result.output
    return result


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


# ---------------------------------------------------------------------------------- images
def test_png_has_the_asked_size_and_is_not_blank(runner, two_runs, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    out = tmp_path / "compare.png"
    result = _plot(runner, *map(str, two_runs), "--output", str(out), "--width", "6", "--height", "4", "--dpi", "50")
    assert result.exit_code == 0, result.output
    assert png_size(out) == (300, 200)
    pixels = image.imread(out)
    assert pixels.shape[:2] == (200, 300)
    assert pixels.var() > 0 and len({tuple(row) for row in pixels.reshape(-1, pixels.shape[-1])}) > 2
    # the defaults, under the keys these runs logged: actor/kl_loss is in both runs, kl only in runB
    assert "5 panels (reward/mean, actor/kl_loss, actor/entropy, response_length/mean, time/*)" in result.stdout
    assert "2 runs (runA, runB)" in result.stdout and "300x200 px" in result.stdout


def test_default_size_is_12_inches_wide_and_3_per_row_of_panels(runner, two_runs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "default.png"
    assert _plot(runner, str(two_runs[0]), "-o", str(out), "--dpi", "20").exit_code == 0
    assert png_size(out) == (240, 196)  # 12 x (0.8 + 3 x 3 rows) inches at 20 dpi
    assert _plot(runner, str(two_runs[0]), "-o", str(out), "--dpi", "20", "-m", "reward/mean").exit_code == 0
    assert png_size(out) == (240, 76)  # one row


def test_svg_is_xml_with_the_run_names_in_the_legend(runner, two_runs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "compare.svg"
    result = _plot(runner, str(two_runs[0]), str(two_runs[1] / "metrics.jsonl"), "-o", str(out),
                   "--metrics", "reward/mean,time/*")
    assert result.exit_code == 0, result.output
    root = ET.parse(out).getroot()
    assert root.tag.endswith("svg")
    text = " ".join(" ".join(element.itertext()) for element in root.iter())
    assert "runA" in text and "runB" in text  # a metrics.jsonl given directly is named by its directory
    assert "reward/mean" in text and "update_actor" in text  # the panel titles and the phase legend
    assert "2 panels (reward/mean, time/*)" in result.stdout


def test_a_metric_no_run_has_is_skipped_with_a_note(runner, two_runs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "some.png"
    result = _plot(runner, *map(str, two_runs), "-o", str(out), "-m", "reward/mean,rewrd/std", "-m", "kl")
    assert result.exit_code == 0, result.output
    assert "skipped rewrd/std: no run has it" in result.stderr
    assert "runA has no kl" in result.stderr and "2 panels (reward/mean, kl)" in result.stdout


# ---------------------------------------------------------------------------------- user errors: exit 2
def test_a_bad_suffix_exits_2(runner, two_runs, tmp_path):
    result = _plot(runner, str(two_runs[0]), "-o", str(tmp_path / "plot.pdf"))
    assert result.exit_code == 2
    assert "--output" in result.stderr and ".pdf" in result.stderr and ".png or .svg" in result.stderr
    assert not (tmp_path / "plot.pdf").exists()


def test_a_missing_run_exits_2_naming_it(runner, two_runs, tmp_path):
    absent = tmp_path / "no-such-run"
    result = _plot(runner, str(two_runs[0]), str(absent), "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 2 and f"run not found: {absent}" in result.stderr


def test_a_directory_without_metrics_jsonl_exits_2_naming_it(runner, two_runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _plot(runner, str(empty), "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 2 and f"{empty} has no metrics.jsonl" in result.stderr
    # the parent of several runs (a pipeline's output_dir) names them
    result = _plot(runner, str(tmp_path), "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 2 and str(two_runs[0]) in result.stderr and str(two_runs[1]) in result.stderr


def test_unknown_metrics_exit_2_listing_the_available_keys(runner, two_runs, tmp_path):
    result = _plot(runner, *map(str, two_runs), "-o", str(tmp_path / "x.png"), "--metrics", "loss,val/*")
    assert result.exit_code == 2
    assert "none of the metrics loss, val/* is in runA, runB" in result.stderr
    assert all(key in result.stderr for key in KEYS + ["kl"])
    assert not (tmp_path / "x.png").exists()


def test_a_line_that_is_not_json_exits_2_naming_file_and_line(runner, tmp_path):
    run = write_run(tmp_path / "run")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], "oops", *lines[1:]]) + "\n")
    result = _plot(runner, str(run), "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 2 and f"{run / 'metrics.jsonl'}:2: not JSON" in result.stderr


def test_without_matplotlib_one_error_says_how_to_install_it(runner, two_runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    result = _plot(runner, str(two_runs[0]), "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 2
    assert "pip install 'rlhfctl[plot]'" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_help_has_examples(runner):
    result = runner.invoke(app, ["plot", "--help"])
    assert result.exit_code == 0 and "rlhfctl plot" in result.stdout and "Example" in result.stdout


def test_the_cli_starts_without_importing_matplotlib():
    probe = "import sys; from rlhfctl.cli import app; print([m for m in sys.modules if m.split('.')[0] == 'matplotlib'])"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------- reading and choosing
def test_reading_keeps_numbers_and_non_finite_strings_and_skips_an_unfinished_last_line(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text('{"step": 2, "loss": 0.5, "note": "text", "flag": true}\n'
                    '{"step": 1, "loss": "nan", "grad": "inf"}\n'
                    '{"step": 2, "loss": 0.25}\n'  # a resumed run logs step 2 again: the last values count
                    '{"step": 3, "lo')
    run = load_run(path.parent)
    assert run.label == "run" and run.keys == ["loss", "grad"] and run.steps == 2
    steps, values = run.series["loss"]
    assert steps == [1.0, 2.0] and math.isnan(values[0]) and values[1] == 0.25
    assert run.series["grad"] == ([1.0], [math.inf])


def test_names_match_as_key_glob_or_prefix():
    keys = ["kl", "kl/coef", "time/generate", "time/step", "reward/mean", "reward/acc/mean", "timeout"]
    assert match_keys("kl", keys) == ["kl"]  # an exact key wins over the kl/ prefix
    assert match_keys("time", keys) == match_keys("time/", keys) == match_keys("time/*", keys) == ["time/generate", "time/step"]
    assert match_keys("reward/*/mean", keys) == ["reward/acc/mean"]
    assert match_keys("nope", keys) == []


def test_a_default_panel_takes_the_key_most_runs_have(tmp_path):
    first, second = load_run(write_run(tmp_path / "a")), load_run(write_run(tmp_path / "b", extra={"kl": 0.1}))
    spec = MetricSpec("KL", ("kl", "actor/kl_loss"))
    assert [panel.keys for panel in choose_panels([first, second], [spec])[0]] == [("actor/kl_loss",)]
    assert [panel.keys for panel in choose_panels([second], [spec])[0]] == [("kl",)]


def test_runs_with_the_same_directory_name_are_told_apart_by_their_parents(tmp_path):
    assert run_labels([tmp_path / "one" / "ppo", tmp_path / "two" / "ppo" / "metrics.jsonl", tmp_path / "sft"]) == [
        "one/ppo", "two/ppo", "sft"]
