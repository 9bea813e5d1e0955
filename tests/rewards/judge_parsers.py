"""Deterministic judge parsers for the tests: a random tiny judge's verdict maps to a known score, or to None."""

from __future__ import annotations


def first_char(verdict: str) -> float | None:
    """None for an empty verdict or a first character whose code is a multiple of 3; else that code mod 7 (0-6)."""
    if not verdict:
        return None
    code = ord(verdict[0])
    return None if code % 3 == 0 else float(code % 7)


def raises(verdict: str) -> float:
    """A parser with a bug."""
    raise ZeroDivisionError("division by zero")
