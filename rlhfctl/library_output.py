"""What other libraries print on their own: kept off the console by default, shown with ``--verbose``.

transformers and huggingface_hub draw tqdm bars when weights load or save ("Loading weights", "Writing
model shards"), torch warns at world 1 that ``torch.distributed`` is not initialized when a checkpoint is
saved in one process, and Ray prefixes every such line with the worker's pid. None of it is something a
user acts on. The settings below reach the driver (:func:`quiet_this_process`) and every worker: the
private local Ray passes :func:`quiet_environment` to its workers, and each worker host applies it at start.
``RLHFCTL_VERBOSE=1`` (``rlhfctl train --verbose``) turns all of it off, and so travels to the workers too.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["VERBOSE_VARIABLE", "quiet_environment", "quiet_this_process", "verbose"]

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
