"""Which paths in a recipe name something on this machine: light enough for the checks that run before torch."""

from __future__ import annotations

__all__ = ["looks_local"]


def looks_local(path: str) -> bool:
    """Whether a model path names a local directory (checked to exist) rather than a hub id."""
    return path.startswith((".", "/", "~"))
