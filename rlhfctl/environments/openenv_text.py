"""Text in, text out: how the model's turn becomes an OpenEnv action, and an observation the next user turn.

OpenEnv environments take typed actions (pydantic models). rlhfctl fills **one text field** of the action with the
turn's text: ``action_field`` when the recipe names it, else the action's only string field (``metadata``, which
every action has, aside). An action whose other fields are required cannot be built from text alone and is refused.

An observation's text is its ``observation_field`` when named, else its only string field, else all its fields as
JSON (sorted keys); ``reward``, ``done`` and ``metadata`` are never shown (the reward and ``done`` go to the step's
result).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["OBSERVATION_RESERVED", "observation_fields", "observation_text", "text_action_field"]

ACTION_RESERVED = frozenset({"metadata"})
OBSERVATION_RESERVED = frozenset({"reward", "done", "metadata"})
_ASK = "set rollout.environment_config.action_field (or ?action_field= in the URL) to the field the model's text goes in"


def _is_text(schema: Mapping[str, Any]) -> bool:
    """Whether a JSON-schema property accepts a string (``str`` or ``Optional[str]``)."""
    if schema.get("type") == "string":
        return True
    return any(_is_text(option) for option in schema.get("anyOf") or [] if isinstance(option, Mapping))


def text_action_field(schema: Mapping[str, Any], configured: str | None, source: str) -> str:
    """The field of the action (its JSON schema) the model's text goes in; ValueError saying what to set when there
    is none, or several to choose from, or other required fields. ``source`` names the action in the message."""
    properties = {name: value for name, value in (schema.get("properties") or {}).items() if name not in ACTION_RESERVED}
    required = [name for name in schema.get("required") or [] if name not in ACTION_RESERVED]
    if configured:
        if configured not in properties:
            raise ValueError(f"{source} has no field {configured!r} (its fields: {', '.join(properties) or 'none'}); {_ASK}")
        field = configured
    else:
        texts = [name for name, value in properties.items() if isinstance(value, Mapping) and _is_text(value)]
        if len(texts) != 1:
            found = f"string fields {', '.join(texts)}" if texts else "no string field"
            raise ValueError(f"{source} has {found}; {_ASK}")
        field = texts[0]
    others = [name for name in required if name != field]
    if others:
        raise ValueError(f"{source} also requires {', '.join(others)}: rlhfctl fills one text field ({field!r}) "
                         "from the model's turn; give the environment an action with a single required text field")
    return field


def observation_fields(observation: Any) -> dict[str, Any]:
    """An observation's own fields (a typed observation's or a plain dict's), without reward, done and metadata."""
    if hasattr(observation, "model_dump"):
        observation = observation.model_dump()
    if not isinstance(observation, Mapping):
        return {"observation": observation}
    return {str(name): value for name, value in observation.items() if name not in OBSERVATION_RESERVED}


def observation_text(observation: Any, field: str | None) -> str:
    """The text the model reads for an observation (see the module docstring for the rule)."""
    fields = observation_fields(observation)
    if field is not None:
        if field not in fields:
            raise ValueError(f"the observation has no field {field!r} (its fields: {', '.join(fields) or 'none'}); "
                             "fix rollout.environment_config.observation_field")
        value = fields[field]
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    texts = [value for value in fields.values() if isinstance(value, str)]
    if len(texts) == 1:
        return texts[0]
    return json.dumps(fields, sort_keys=True, default=str) if fields else ""
