"""What other libraries print on their own: kept off the console by default, shown with ``--verbose``.

transformers and huggingface_hub draw tqdm bars when weights load or save ("Loading weights", "Writing
model shards"), torch warns at world 1 that ``torch.distributed`` is not initialized when a checkpoint is
saved in one process, and Ray prefixes every such line with the worker's pid. None of it is something a
user acts on. The settings below reach the driver (:func:`quiet_this_process`) and every worker: the
private local Ray passes :func:`quiet_environment` to its workers, and each worker host applies it at start.
``RLHFCTL_VERBOSE=1`` (``rlhfctl train --verbose``) turns all of it off, and so travels to the workers too.

What does reach the console keeps no terminal escape codes where the console is not a terminal (a log file,
CI, a pipe): Ray colours the ``(Worker pid=...)`` prefix of every line it forwards from the workers and the
raylet, and some of those lines carry colours of their own. :func:`plain_when_not_a_terminal` wraps such a
``sys.stdout`` / ``sys.stderr`` in :class:`PlainStream`, which drops them (:func:`strip_ansi`); ``FORCE_COLOR``
keeps them, for CI logs that render colour.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Iterable
from typing import Any, TextIO

__all__ = ["ANSI", "VERBOSE_VARIABLE", "PlainStream", "plain_when_not_a_terminal", "quiet_environment",
           "quiet_this_process", "strip_ansi", "verbose"]

ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
"""A terminal escape sequence: CSI (colours, cursor moves, erasing), OSC (window titles, links) or a two-byte one."""

VERBOSE_VARIABLE = "RLHFCTL_VERBOSE"

# Variables read when a library starts (PYTHONWARNINGS when the interpreter does): set for processes to come.
_QUIET_VARIABLES = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' load and save bars are huggingface_hub's tqdm
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}
# (message prefix, category): warnings about settings rlhfctl chose on purpose.
_QUIET_WARNINGS = (
    ("torch.distributed is disabled, unavailable or uninitialized", UserWarning),  # a world-1 checkpoint save
)


def verbose() -> bool:
    """Whether the user asked to see every library's own output (``RLHFCTL_VERBOSE=1``)."""
    return os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0", "false")


def quiet_environment() -> dict[str, str]:
    """The variables that keep libraries' own output off the console, for processes started from here
    (empty under ``RLHFCTL_VERBOSE=1``); a variable the user set keeps the user's value."""
    if verbose():
        return {}
    return {key: value for key, value in _QUIET_VARIABLES.items() if key not in os.environ}


def quiet_this_process() -> None:
    """Apply the quiet settings to this process: the variables (for libraries not yet imported) and the
    warning filters. A no-op under ``RLHFCTL_VERBOSE=1``."""
    if verbose():
        return
    os.environ.update(quiet_environment())
    if "huggingface_hub" in sys.modules:  # already imported, it read its variable then: tell it directly
        from huggingface_hub.utils import disable_progress_bars  # only when it is loaded already (the test above)

        disable_progress_bars()
    for message, category in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves, titles)."""
    return ANSI.sub("", text)


class PlainStream:
    """A text stream that writes what it is given without terminal escape sequences; everything else is the
    wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        """Write ``text`` less its escape sequences; returns ``len(text)``, as if all of it was written."""
        self.wrapped.write(strip_ansi(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        """Write each line as :meth:`write` does."""
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def plain_when_not_a_terminal() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in :class:`PlainStream` where they are not terminals, so what Ray
    forwards from the workers and the raylet lands in logs without escape codes (idempotent; not with
    ``FORCE_COLOR`` set)."""
    if os.environ.get("FORCE_COLOR"):
        return
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, PlainStream) and not _is_terminal(stream):
            setattr(sys, name, PlainStream(stream))
