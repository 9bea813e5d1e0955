"""What is wrong with a recipe: RecipeError (the one exception a bad recipe raises, with the key path it is
about), and the Issues validation collects (errors and warnings, each naming its key path)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from rlhfctl.errors import UserError

__all__ = ["Issue", "RecipeError", "did_you_mean", "error", "warning"]


class RecipeError(UserError):
    """A recipe (file, override or value) is not usable; ``str(error)`` is one line for the user.

    ``key_path`` is the dotted key the problem is about (None for file-level problems) and
    ``kind`` classifies it: file_not_found, yaml_syntax, override_syntax, unknown_key, wrong_type,
    missing, bad_choice, out_of_range, interpolation, invalid.
    """

    def __init__(self, message: str, key_path: str | None = None, kind: str = "invalid") -> None:
        super().__init__(message)
        self.message = message
        self.key_path = key_path
        self.kind = kind

    def __str__(self) -> str:
        return self.message


def did_you_mean(word: str, candidates: Iterable[str], prefix: str = "") -> str:
    """A "; did you mean 'x'?" suffix for the closest candidate (shown after ``prefix``), or ""."""
    matches = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f"; did you mean '{prefix}{matches[0]}'?" if matches else ""


# ---------------------------------------------------------------------------------- issues found by validation
@dataclass(frozen=True)
class Issue:
    """One finding: ``severity`` is "error" (the run cannot work) or "warning" (it can, but check this)."""

    severity: str
    key_path: str | None
    message: str


def error(key_path: str | None, message: str) -> Issue:
    """An error issue (the message should name the key path)."""
    return Issue("error", key_path, message)


def warning(key_path: str | None, message: str) -> Issue:
    """A warning issue (the message should name the key path)."""
    return Issue("warning", key_path, message)
