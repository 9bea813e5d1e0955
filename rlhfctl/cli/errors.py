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

import sys
from types import ModuleType
from typing import Any

import typer
from rich.console import Console

from rlhfctl.cli.console import print_error, print_line
from rlhfctl.errors import Diverged, UserError, WorkerLost, is_user_error

__all__ = ["EXIT_DIVERGED", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USER", "EXIT_WORKER_FAILED",
           "click_exceptions", "exit_code_for", "guarded", "usage_message", "user_message"]

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USER = 2
EXIT_WORKER_FAILED = 3
EXIT_DIVERGED = 4
EXIT_INTERRUPTED = 130

#: Failures reported in one line without a traceback, by family (rlhfctl.errors), with their exit codes.
RUNTIME_FAILURES: tuple[tuple[type[BaseException], int], ...] = ((WorkerLost, EXIT_WORKER_FAILED), (Diverged, EXIT_DIVERGED))


def _user_error_in_worker(error: BaseException) -> bool:
    """A worker method that failed with a user error (e.g. ModelConfigError in init_model): its flag says so."""
    return not isinstance(error, UserError) and is_user_error(error)


def exit_code_for(error: BaseException) -> int:
    """The exit code for an exception that ended a command."""
    if isinstance(error, KeyboardInterrupt):
        return getattr(error, "exit_code", EXIT_INTERRUPTED)  # RunSignalled carries 128 + its signal
    if is_user_error(error):
        return EXIT_USER
    for family, code in RUNTIME_FAILURES:
        if isinstance(error, family):
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


def click_exceptions() -> ModuleType:
    """The module of the usage-error classes typer raises: click's, or the copy of click that newer typer ships."""
    return sys.modules[typer.BadParameter.__module__]


def usage_message(error: Any) -> str:
    """The one-line message for a command-line usage error: ``<option or argument>: <what is wrong>``."""
    clicks = click_exceptions()
    if isinstance(error, clicks.BadParameter) and not isinstance(error, clicks.MissingParameter):
        hint = error.param_hint
        if hint is None and error.param is not None:
            hint = list(getattr(error.param, "opts", None) or []) or error.param.name
        if hint:
            hint = hint if isinstance(hint, str) else " / ".join(hint)
            message = str(error.message).removeprefix("Value error, ")  # newer typer's wording of a bad choice
            return f"{hint.strip(chr(39)).strip(chr(34))}: {message}"
    text = " ".join(error.format_message().split())
    command = error.ctx.command_path if error.ctx is not None else "rlhfctl"
    return f"{text} (see {command} -h)"


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
