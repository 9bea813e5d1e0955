"""Exceptions raised while reading and preparing prompt data."""

from __future__ import annotations

from rlhfctl.errors import UserError

__all__ = ["DataConfigError", "DataFileError"]


class DataFileError(UserError, ValueError):
    """A data file (or a record in it) cannot be used; the message names the file and the place."""


class DataConfigError(UserError, ValueError):
    """Data settings do not fit the data, e.g. a batch size larger than the dataset."""
