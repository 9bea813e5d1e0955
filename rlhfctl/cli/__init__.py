"""The ``rlhfctl`` command line: train, validate, inspect-dispatch, recipes."""

from rlhfctl.cli.app import app, main

__all__ = ["app", "main"]
