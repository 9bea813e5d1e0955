"""The settings part of a task name, ``<task>?key=value&...``: one rule for every task that takes settings.

A recipe picks a task's settings in ``data.task`` itself (``repeat?max_len=32&alpha=1.5``,
``reasoning_gym:leg_counting?max_animals=3``), so a task stays one string in a recipe, in a mixture entry
and on the command line. Each value reads as a YAML scalar or flow list (``3`` is an int, ``1.5`` a float,
``[+]`` a list); what keys a task takes, and which values, is the task's own rule.
"""

from __future__ import annotations

from typing import Any

import yaml

from rlhfctl.tasks.task import UnknownTaskError

__all__ = ["TaskQueryError", "parse_query", "split_name"]


class TaskQueryError(UnknownTaskError):
    """The query of a task name is not ``key=value&...`` with each key once and each value YAML."""


def split_name(name: str) -> tuple[str, str]:
    """``"repeat?max_len=8"`` -> ``("repeat", "max_len=8")``; a name without a query gives ``""``."""
    base, _, query = name.partition("?")
    return base, query


def parse_query(name: str, query: str) -> dict[str, Any]:
    """The settings of ``query`` (the part of ``name`` after ``?``), its values read as YAML; TaskQueryError when
    a part is not ``key=value``, a key is set twice or a value is not YAML (``name`` is for the messages)."""
    settings: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        key, equals, text = part.partition("=")
        if not equals or not key:
            raise TaskQueryError(f"{name!r}: {part!r} is not key=value in the query")
        if key in settings:
            raise TaskQueryError(f"{name!r}: {key!r} is set twice in the query")
        try:
            settings[key] = yaml.safe_load(text)
        except yaml.YAMLError:
            raise TaskQueryError(f"{name!r}: the value of {key!r} ({text!r}) is not a YAML scalar or list") from None
    return settings
