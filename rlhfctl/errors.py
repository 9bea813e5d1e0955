"""The error families a run can end with; the CLI maps each family to its exit code with ``isinstance``.

Each concrete error lives next to the code that raises it (``RecipeError`` in ``rlhfctl.recipe``,
``DataFileError`` in ``rlhfctl.data``, ...) and derives from one of these bases, so renaming or
moving a class keeps its exit code. This module imports nothing, so classifying an error is cheap.
"""

from __future__ import annotations

__all__ = ["Diverged", "UserError", "WorkerLost", "is_user_error"]


class UserError(Exception):
    """Fix your recipe, data or settings (exit 2): the message is shown on one line, without a traceback.

    Recipe, pipeline, data file, data settings, model config, task, resource pool and reward-function
    errors derive from it.
    """


class WorkerLost(RuntimeError):
    """A worker process died, or stopped answering within its time limit (exit 3)."""


class Diverged(RuntimeError):
    """Training produced a NaN or infinite loss or reward (exit 4); the last good checkpoint is kept."""


def is_user_error(error: BaseException) -> bool:
    """A UserError, or a worker failure whose cause was one (it carries ``user_error=True``)."""
    return isinstance(error, UserError) or getattr(error, "user_error", False) is True
