"""Rich consoles for command output: colour and live views on a terminal, wide plain text otherwise."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.text import Text

__all__ = ["make_console", "print_error", "print_line"]

_PLAIN_WIDTH = 120


def make_console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr) that is 120 columns wide when not a terminal (logs, CI, pipes)."""
    stream = sys.stderr if stderr else sys.stdout
    terminal = bool(getattr(stream, "isatty", lambda: False)())
    width = None if terminal or os.environ.get("COLUMNS") else _PLAIN_WIDTH
    return Console(stderr=stderr, width=width, highlight=False)


def print_line(console: Console, text: str, style: str = "") -> None:
    """Print one line as-is (no markup, no wrapping), optionally styled."""
    console.print(Text(text, style=style), soft_wrap=True)


def print_error(console: Console, text: str) -> None:
    """Print a one-line red error message."""
    print_line(console, f"error: {text}", "bold red")
