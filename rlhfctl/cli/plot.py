"""``rlhfctl plot``: draw the metrics of one or more runs into a PNG or SVG, runs on shared axes.

The work is in :mod:`rlhfctl.plotting` (reading metrics.jsonl, choosing the panels, drawing), imported
when the command runs: matplotlib is an optional dependency and stays off the CLI's startup.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rlhfctl.cli.console import make_console, print_line
from rlhfctl.cli.errors import guarded

__all__ = ["plot"]


def plot(
    runs: List[Path] = typer.Argument(..., metavar="RUN", show_default=False,
                                      help="a run's output directory (it holds metrics.jsonl), or a metrics.jsonl file"),
    output: Path = typer.Option(..., "--output", "-o", metavar="FILE", show_default=False,
                                help="the image to write: .png or .svg (the suffix picks the format)"),
    metrics: Optional[List[str]] = typer.Option(
        None, "--metrics", "-m", metavar="M1,M2,...", show_default=False,
        help="metrics to plot, one panel each: a key (reward/mean), a glob (`time/*`) or a prefix (time = `time/*`); "
             "default: reward, KL, entropy, response length, phase times"),
    width: Optional[float] = typer.Option(None, "--width", min=1, max=100, show_default=False,
                                          help="image width in inches (pixels = inches x --dpi) [default: 12]"),
    height: Optional[float] = typer.Option(None, "--height", min=1, max=100, show_default=False,
                                           help="image height in inches [default: 3 per row of two panels, plus 0.8]"),
    dpi: int = typer.Option(100, "--dpi", min=10, max=1200, help="pixels per inch (a PNG's size; an SVG is vector)"),
) -> None:
    """Plot the metrics of one or more runs (their metrics.jsonl) into a PNG or SVG, to compare them at a glance.

    One panel per metric, x = step; the runs share every panel's axes, one colour each, named in the
    legend by their directory names (with parent directories where names repeat).
    Without --metrics: the reward (reward/mean), the KL (kl, else actor/kl_loss), the entropy
    (actor/entropy, else entropy), the response length (response_length/mean) and the phase times
    (`time/*`: time/generate, time/update_actor, ..., time/step) together in one panel.
    --metrics takes comma-separated names (or the option repeated); each is one panel and is matched
    against the runs' keys as an exact key (reward/mean), else as a glob when it holds `*`, `?` or `[`
    (`time/*`, `reward/*/mean`; `*` also crosses /), else as a prefix up to a / (time is `time/*`). The keys a
    glob or prefix matches share its panel, one line each. A metric no run has is skipped with a note.
    The image is --width x --height inches (default 12 wide, 3 per row of two panels plus 0.8 for the
    legend); a PNG is that times --dpi in pixels (12 x 9.8 in at 100 dpi: 1200 x 980 px).
    Exits 2 for a missing run or metrics.jsonl, an output that is not .png or .svg, metrics that no
    run has, and when matplotlib is not installed (pip install 'rlhfctl[plot]').

    Examples:

      rlhfctl plot runs/quickstart -o quickstart.png

      rlhfctl plot runs/grpo runs/ppo --metrics 'reward/mean,time/*' -o compare.svg

      rlhfctl plot runs/a/metrics.jsonl runs/b -m reward/mean,actor/entropy -o ab.png --width 8 --height 6 --dpi 150
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        from rlhfctl.plotting.draw import MAX_PIXELS, default_size, draw, image_format
        from rlhfctl.plotting.metrics_file import load_runs
        from rlhfctl.plotting.panels import choose_panels, split_metrics

        if image_format(output) is None:
            raise typer.BadParameter(f"{output}: the suffix picks the format, .png or .svg "
                                     f"(got {output.suffix or 'no suffix'})", param_hint="--output")
        specs = None
        if metrics is not None:
            specs = split_metrics(metrics)
            if not specs:
                raise typer.BadParameter("give metric names, comma-separated (reward/mean,time/*)", param_hint="--metrics")
        loaded = load_runs(list(runs))
        for run in loaded:
            if not run.keys:
                print_line(err, f"note: {run.label} has no steps logged yet ({run.path})", "yellow")
        panels, notes = choose_panels(loaded, specs)
        for note in notes:
            print_line(err, f"note: {note}", "yellow")
        default_width, default_height = default_size(len(panels))
        width_in, height_in = width or default_width, height or default_height
        for option, inches in (("--width", width_in), ("--height", height_in)):
            if round(inches * dpi) > MAX_PIXELS:
                raise typer.BadParameter(f"{inches:g} in at {dpi} dpi is {round(inches * dpi)} pixels; at most "
                                         f"{MAX_PIXELS}: lower it or --dpi", param_hint=option)
        written = draw(loaded, panels, output, width_in, height_in, dpi)
        size = (f"{round(width_in * dpi)}x{round(height_in * dpi)} px" if image_format(written) == "png"
                else f"{width_in:g}x{height_in:g} in")
        print_line(console, f"wrote {written} ({size}): {len(panels)} panel{'s' * (len(panels) != 1)} "
                            f"({', '.join(panel.title for panel in panels)}) for {len(loaded)} "
                            f"run{'s' * (len(loaded) != 1)} ({', '.join(run.label for run in loaded)})")
