"""Exit codes, and the one place that maps exceptions to them and to a message.

0 success; 1 internal error (a bug: the traceback is printed); 2 a user error (recipe, data, model
settings, reward function: one red line naming the key, no traceback); 3 a worker process died or a
call timed out (one line naming role, rank and method); 4 training diverged (NaN or infinite loss or
reward; the last good checkpoint is kept); 130 interrupted (Ctrl-C); 143 stopped by SIGTERM and 138 by
SIGUSR1 (128 + the signal number; the run saved first, see :mod:`rlhfctl.run_signals`).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator

import typer
from rich.console import Console

from rlhfctl.cli.console import print_error, print_line

__all__ = ["EXIT_DIVERGED", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USER", "EXIT_WORKER_FAILED",
           "exit_code_for", "guarded", "user_message"]

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USER = 2
EXIT_WORKER_FAILED = 3
EXIT_DIVERGED = 4
EXIT_INTERRUPTED = 130

#: Runtime failures reported in one line without a traceback, with their exit codes.
RUNTIME_FAILURES = {
    "rlhfctl.single_controller.errors.WorkerDiedError": EXIT_WORKER_FAILED,
    "rlhfctl.single_controller.errors.WorkerTimeoutError": EXIT_WORKER_FAILED,
    "rlhfctl.trainer.ppo_trainer.TrainingDiverged": EXIT_DIVERGED,
}

#: Exceptions that mean "fix your recipe, data or settings", by qualified class name (matched along the
#: MRO, so nothing is imported to classify an error).
USER_ERRORS = frozenset({
    "rlhfctl.recipe.errors.RecipeError",
    "rlhfctl.data.errors.DataFileError",
    "rlhfctl.data.errors.DataConfigError",
    "rlhfctl.models.loading.ModelConfigError",
    "rlhfctl.tasks.UnknownTaskError",
    "rlhfctl.single_controller.errors.ResourcePoolError",
    "workers.reward_functions.RewardFunctionError",
    "workers.reward_functions.RewardOutputError",
})
_USER_ERROR_NAMES = frozenset(name.rpartition(".")[2] for name in USER_ERRORS)
_WORKER_METHOD_ERROR = "rlhfctl.single_controller.errors.WorkerMethodError"


def _qualified_names(error: BaseException) -> set[str]:
    return {f"{cls.__module__}.{cls.__qualname__}" for cls in type(error).__mro__}


def _user_error_in_worker(error: BaseException) -> bool:
    """A worker method that failed with a user error (e.g. ModelConfigError in init_model)."""
    if _WORKER_METHOD_ERROR not in _qualified_names(error):
        return False
    detail = str(getattr(error, "detail", ""))
    return detail.partition(":")[0].strip() in _USER_ERROR_NAMES


def exit_code_for(error: BaseException) -> int:
    """The exit code for an exception that ended a command."""
    if isinstance(error, KeyboardInterrupt):
        return getattr(error, "exit_code", EXIT_INTERRUPTED)  # RunSignalled carries 128 + its signal
    names = _qualified_names(error)
    if names & USER_ERRORS or _user_error_in_worker(error):
        return EXIT_USER
    for name, code in RUNTIME_FAILURES.items():
        if name in names:
            return code
    return EXIT_INTERNAL


def user_message(error: BaseException) -> str:
    """The one-line message shown for a user error."""
    if _user_error_in_worker(error):
        role, method, rank = (getattr(error, name, "?") for name in ("role", "method", "rank"))
        detail = str(getattr(error, "detail", "")).splitlines()[0]
        return f"{role}.{method} (rank {rank}): {detail}"
    text = str(error).strip() or type(error).__name__
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


@contextlib.contextmanager
def guarded(err: Console) -> Iterator[None]:
    """Run a command body; turn any exception into its message and exit code (typer.Exit passes through)."""
    try:
        yield
    except (typer.Exit, typer.Abort, typer.TyperException):
        raise  # usage errors (BadParameter) and exits are typer's to report
    except KeyboardInterrupt as error:
        print_line(err, str(error) or "interrupted", "yellow")
        raise typer.Exit(exit_code_for(error)) from None
    except Exception as error:  # noqa: BLE001 - the single place that maps errors to exit codes
        code = exit_code_for(error)
        if code in (EXIT_USER, EXIT_WORKER_FAILED, EXIT_DIVERGED):
            print_error(err, user_message(error))
        else:
            print_line(err, "".join(traceback.format_exception(error)).rstrip())
            print_error(err, f"internal error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        raise typer.Exit(code) from None
