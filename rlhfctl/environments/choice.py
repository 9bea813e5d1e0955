"""``rollout.environment`` resolved, once: the kind, its target, and the multi-turn environment it runs as.

:func:`environment_choice` parses the key; :func:`effective_rollout` is the rollout section the workers read, with
``multi_turn`` turned on and running the kind's adapter as its ``environment``. ``rlhfctl.recipe.resolved`` calls
both where the recipe is resolved, and ``rlhfctl/recipe/check_environments.py`` reports the choice's problem (an
unknown kind, both environment keys set, a target the kind cannot read): nothing here raises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlhfctl.environments.kinds import ENVIRONMENT_KINDS
from rlhfctl.recipe.errors import did_you_mean
from rlhfctl.recipe.schema import sealed

__all__ = ["ENVIRONMENT_KEY", "EnvironmentChoice", "effective_rollout", "environment_choice"]

ENVIRONMENT_KEY = "rollout.environment"
_EXAMPLE = "openenv:http://127.0.0.1:8000"
_URL_SCHEMES = ("http", "https", "ws", "wss")


@dataclass(frozen=True)
class EnvironmentChoice:
    """What ``rollout.environment`` names: ``entry`` is the ``{class, config}`` the rollout runs as its
    ``multi_turn.environment``; None, with ``problem`` (one line naming the key), when the key is unusable."""

    kind: str
    target: str
    entry: Mapping[str, Any] | None
    problem: str | None = None

    @property
    def adapter_config(self) -> dict[str, Any]:
        """The config the kind's adapter is built with (empty with a problem)."""
        return dict(self.entry["config"]) if self.entry is not None else {}


def environment_choice(rollout: Mapping[str, Any]) -> EnvironmentChoice | None:
    """``rollout.environment`` parsed (None when unset); its problem recorded, not raised, for validate to report."""
    value = rollout.get("environment")
    if value is None or value == "":
        return None
    text = str(value)
    kind, colon, target = text.partition(":")

    def unusable(problem: str) -> EnvironmentChoice:
        return EnvironmentChoice(kind=kind, target=target, entry=None, problem=problem)

    known = ", ".join(sorted(ENVIRONMENT_KINDS))
    if not colon or not kind or not target:
        return unusable(f"{ENVIRONMENT_KEY}: expected <kind>:<target> such as {_EXAMPLE}, got {text!r} (known kinds: {known})")
    if kind not in ENVIRONMENT_KINDS:
        hint = f"; did you mean 'openenv:{text}'?" if kind in _URL_SCHEMES else did_you_mean(kind, ENVIRONMENT_KINDS)
        return unusable(f"{ENVIRONMENT_KEY}: unknown kind {kind!r} in {text!r} (known kinds: {known}){hint}")
    if (rollout.get("multi_turn") or {}).get("environment"):
        return unusable(f"{ENVIRONMENT_KEY} and rollout.multi_turn.environment are both set: keep one "
                        f"({ENVIRONMENT_KEY} runs as the multi-turn environment itself)")
    spec = ENVIRONMENT_KINDS[kind]
    try:
        config = spec.adapter_config(target, dict(rollout.get("environment_config") or {}))
    except ValueError as error:
        return unusable(str(error))
    return EnvironmentChoice(kind=kind, target=target, entry=sealed({"class": spec.adapter, "config": config}))


def effective_rollout(rollout: Any, choice: EnvironmentChoice | None) -> Any:
    """The rollout section the workers read: with a usable choice, ``multi_turn`` turned on and running its adapter as
    the environment (the one home of that rule); the section itself otherwise."""
    if choice is None or choice.entry is None:
        return rollout
    multi_turn = dataclasses.replace(rollout.multi_turn, enable=True, environment=dict(choice.entry))
    return dataclasses.replace(rollout, multi_turn=multi_turn)
