"""Drawing the panels of several runs into one PNG or SVG, with matplotlib's Agg canvas.

matplotlib is an optional dependency (``pip install 'rlhfctl[plot]'``) imported only when drawing. pyplot
is not used: the figure is drawn on its own non-interactive Agg canvas, so no display, GUI backend or
global matplotlib state is involved. The layout: two panels per row (a lone last panel spans its row),
x = step on one shared axis, the runs' legend above the panels. A run keeps one colour in every panel. In a
panel of several keys (``time/*``) each key has its own line: with one run, its own colour; with several,
the run's colour and the key's line style and marker, named in the panel's own legend.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

from rlhfctl.errors import UserError
from rlhfctl.plotting.metrics_file import RunMetrics
from rlhfctl.plotting.panels import Panel

__all__ = ["FORMATS", "MAX_PIXELS", "MissingMatplotlibError", "default_size", "draw", "grid_shape", "image_format",
           "import_matplotlib"]

#: The output's suffix picks the format.
FORMATS = {".png": "png", ".svg": "svg"}
#: The largest width or height of an image, in pixels (inches x dpi).
MAX_PIXELS = 16000
DEFAULT_WIDTH_IN = 12.0
PANEL_HEIGHT_IN = 3.0
LEGEND_HEIGHT_IN = 0.8
_MARKED_POINTS = 20  # a line of at most this many points marks each point
_LINESTYLES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "v", "D", "x", "*", "P")


class MissingMatplotlibError(UserError):
    """``rlhfctl plot`` needs matplotlib, an optional dependency (exit 2)."""


def image_format(output: str | Path) -> str | None:
    """``png`` or ``svg`` by the output's suffix (any case), else None."""
    return FORMATS.get(Path(output).suffix.lower())


def import_matplotlib() -> Any:
    """The matplotlib module, or :class:`MissingMatplotlibError` saying how to install it."""
    try:
        import matplotlib.backends.backend_agg  # binds matplotlib; the canvas draw() uses
    except ImportError as error:
        raise MissingMatplotlibError(f"plotting needs matplotlib, which is not installed ({error.msg}): "
                                     "pip install 'rlhfctl[plot]'") from None
    return matplotlib


def grid_shape(panels: int) -> tuple[int, int]:
    """(rows, columns): one column for one panel, else two."""
    columns = 1 if panels <= 1 else 2
    return max(1, math.ceil(panels / columns)), columns


def default_size(panels: int) -> tuple[float, float]:
    """(width, height) in inches: 12 wide, 3 per row of panels plus 0.8 for the legend."""
    rows, _ = grid_shape(panels)
    return DEFAULT_WIDTH_IN, LEGEND_HEIGHT_IN + PANEL_HEIGHT_IN * rows


def _run_style(index: int) -> dict[str, Any]:
    return {"color": f"C{index % 10}", "linestyle": _LINESTYLES[(index // 10) % len(_LINESTYLES)]}


def _short_names(keys: tuple[str, ...]) -> list[str]:
    """The keys without the path they share: time/generate, time/step -> generate, step."""
    common = os.path.commonprefix(list(keys))
    cut = common.rfind("/") + 1
    return [key[cut:] or key for key in keys]


def _finite(values: list[float]) -> list[float]:
    return [value if math.isfinite(value) else math.nan for value in values]


def _draw_panel(axes: Any, panel: Panel, runs: list[RunMetrics]) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    grouped = len(panel.keys) > 1
    drawn: set[int] = set()
    for run_index, run in enumerate(runs):
        for key_index, key in enumerate(panel.keys):
            if key not in run.series:
                continue
            steps, values = run.series[key]
            style = _run_style(run_index)
            marker = "o" if len(steps) <= _MARKED_POINTS else None  # a lone point shows
            if grouped and len(runs) == 1:
                style = {"color": f"C{key_index % 10}", "linestyle": "-"}
            elif grouped:
                style["linestyle"] = _LINESTYLES[key_index % len(_LINESTYLES)]
                marker = _MARKERS[key_index % len(_MARKERS)]
            every = max(1, len(steps) // 15) if grouped and len(runs) > 1 else 1  # the key's marker, spaced out
            axes.plot(steps, _finite(values), marker=marker, markersize=3, linewidth=1.4, markevery=every, **style)
            drawn.add(key_index)
    if grouped:
        names = _short_names(panel.keys)
        handles = []
        for key_index in sorted(drawn):
            if len(runs) == 1:
                style = {"color": f"C{key_index % 10}", "linestyle": "-", "marker": "o"}
            else:
                style = {"color": "0.35", "linestyle": _LINESTYLES[key_index % len(_LINESTYLES)],
                         "marker": _MARKERS[key_index % len(_MARKERS)]}
            handles.append(Line2D([], [], markersize=4, label=names[key_index], **style))
        axes.legend(handles=handles, fontsize="small", ncols=2 if len(handles) > 4 else 1)
    axes.set_title(panel.title, fontsize="medium")
    axes.set_xlabel("step")
    if panel.unit:
        axes.set_ylabel(panel.unit)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)


def draw(runs: list[RunMetrics], panels: list[Panel], output: str | Path, width: float, height: float,
         dpi: float = 100) -> Path:
    """Draw ``panels`` for ``runs`` into ``output`` (PNG or SVG by its suffix), ``width`` x ``height`` inches at
    ``dpi`` (a PNG is ``round(width * dpi)`` x ``round(height * dpi)`` pixels); returns the path written."""
    output = Path(output)
    fmt = image_format(output)
    if fmt is None:
        raise UserError(f"{output}: the suffix picks the format, .png or .svg (got {output.suffix or 'none'})")
    matplotlib = import_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    # svg.fonttype none: text stays text in an SVG (searchable, and the run names readable by tools);
    # hashsalt and no date: the same runs give the same SVG.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "rlhfctl"}), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # constrained layout's "axes sizes collapsed" on tiny sizes
        figure = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
        FigureCanvasAgg(figure)
        rows, columns = grid_shape(len(panels))
        grid = figure.add_gridspec(rows, columns)
        first = None  # every panel shares the first one's steps axis
        for index, panel in enumerate(panels):
            row, column = divmod(index, columns)
            alone = index == len(panels) - 1 and column == 0 and columns > 1
            axes = figure.add_subplot(grid[row, :] if alone else grid[row, column], sharex=first)
            first = first or axes
            _draw_panel(axes, panel, runs)
        handles = [Line2D([], [], linewidth=2, label=run.label, **_run_style(index)) for index, run in enumerate(runs)]
        figure.legend(handles=handles, loc="outside upper center", ncols=min(len(runs), 4), frameon=False)
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(output, format=fmt, dpi=dpi, metadata={"Date": None} if fmt == "svg" else None)
        except OSError as error:
            raise UserError(f"cannot write {output}: {error.strerror or error}") from None
    return output
