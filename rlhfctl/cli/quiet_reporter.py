"""QuietReporter: prints nothing but error messages (to stderr)."""

from __future__ import annotations

from rich.console import Console

from rlhfctl.cli.console import print_error
from rlhfctl.cli.reporter_base import BaseReporter

__all__ = ["QuietReporter"]


class QuietReporter(BaseReporter):
    """For ``--quiet``: silent except ``message(..., level="error")``."""

    def __init__(self, err_console: Console) -> None:
        self.err = err_console

    def message(self, text: str, level: str = "info") -> None:
        """Show errors only."""
        if level == "error":
            print_error(self.err, text)
