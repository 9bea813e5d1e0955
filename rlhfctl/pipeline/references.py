"""``${stages.<name>.<attribute>}``: how a stage refers to an earlier stage's outputs.

References are found and replaced in override strings and in the string values of inline recipes,
before the recipe is loaded; every other ``${...}`` is left for the recipe's own interpolation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlhfctl.pipeline.errors import PipelineError
from rlhfctl.pipeline.spec import STAGE_ATTRIBUTES
from rlhfctl.recipe.errors import did_you_mean

__all__ = ["REFERENCE", "check_references", "substitute"]

REFERENCE = re.compile(r"\$\{\s*stages\.([^.}\s]+)\.([^}\s]+)\s*\}")


def _strings(value: Any, where: str) -> list[tuple[str, str]]:
    """(where, text) for every string inside ``value``."""
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, Mapping):
        return [found for key, item in value.items() for found in _strings(item, f"{where}.{key}")]
    if isinstance(value, Sequence):
        return [found for index, item in enumerate(value) for found in _strings(item, f"{where}[{index}]")]
    return []


def check_references(value: Any, where: str, stage: str, earlier: Sequence[str], later: Sequence[str]) -> None:
    """Raise PipelineError for a reference to an unknown, later or same stage, or an unknown attribute."""
    for place, text in _strings(value, where):
        for match in REFERENCE.finditer(text):
            name, attribute = match.group(1), match.group(2)
            reference = match.group(0)
            if name == stage:
                raise PipelineError(
                    f"{place}: {reference} refers to stage {stage!r} itself; a stage can only use earlier stages' outputs",
                    key_path=place,
                )
            if name in later:
                raise PipelineError(
                    f"{place}: {reference} refers to stage {name!r}, which runs after {stage!r}; move it earlier in stages",
                    key_path=place,
                )
            if name not in earlier:
                known = [*earlier, stage, *later]
                raise PipelineError(
                    f"{place}: {reference} refers to unknown stage {name!r}{did_you_mean(name, known)} "
                    f"(stages: {', '.join(known)})",
                    key_path=place,
                )
            if attribute not in STAGE_ATTRIBUTES:
                raise PipelineError(
                    f"{place}: {reference} has unknown attribute {attribute!r}{did_you_mean(attribute, STAGE_ATTRIBUTES)} "
                    f"(use {', '.join(STAGE_ATTRIBUTES)})",
                    key_path=place,
                )


def substitute(value: Any, outputs: Mapping[str, Mapping[str, str]]) -> Any:
    """``value`` with every ``${stages.<name>.<attribute>}`` replaced from ``outputs[name][attribute]``."""
    if isinstance(value, str):
        return REFERENCE.sub(lambda match: outputs[match.group(1)][match.group(2)], value)
    if isinstance(value, Mapping):
        return {key: substitute(item, outputs) for key, item in value.items()}
    if isinstance(value, list):
        return [substitute(item, outputs) for item in value]
    return value
