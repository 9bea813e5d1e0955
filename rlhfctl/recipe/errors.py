"""RecipeError: the one exception a bad recipe produces, with the key path it is about."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from rlhfctl.errors import UserError

__all__ = ["RecipeError", "did_you_mean"]


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
