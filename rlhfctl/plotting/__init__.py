"""Plotting runs' metrics (``rlhfctl plot``): read each run's metrics.jsonl, choose the panels, draw them.

Three steps, three modules, so that each can be used and tested alone:

* :mod:`rlhfctl.plotting.metrics_file` reads a run's ``metrics.jsonl`` into per-metric series (no matplotlib);
* :mod:`rlhfctl.plotting.panels` turns the metric names asked for (keys, globs, ``prefix/``) into panels;
* :mod:`rlhfctl.plotting.draw` draws the panels into a PNG or SVG with matplotlib (imported only there).

Nothing here is imported at the CLI's startup.
"""
