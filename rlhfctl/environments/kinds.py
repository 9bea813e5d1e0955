"""The registry of environment kinds: what ``<kind>`` in ``rollout.environment: <kind>:<target>`` may be.

Adding a kind is one entry in :data:`ENVIRONMENT_KINDS`: an :class:`EnvironmentKind` whose adapter is an
:class:`~rlhfctl.agents.Environment` speaking the ecosystem's protocol, whose ``adapter_config`` turns the target
and ``rollout.environment_config`` into that adapter's config, and whose ``checks`` are what ``rlhfctl validate``
runs for it, in order. Nothing here imports an ecosystem's package: the adapter and the checks do, lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rlhfctl.environments import openenv_checks, openenv_settings

__all__ = ["ENVIRONMENT_KINDS", "EnvironmentKind"]


@dataclass(frozen=True)
class EnvironmentKind:
    """One ecosystem whose environments a recipe names by ``rollout.environment: <name>:<target>``."""

    name: str
    extra: str
    """The rlhfctl extra that installs the ecosystem's client: ``pip install 'rlhfctl[<extra>]'``."""
    adapter: str
    """``module:Class`` of the :class:`~rlhfctl.agents.Environment` that runs one episode over the ecosystem's protocol."""
    adapter_config: Callable[[str, Mapping[str, Any]], dict[str, Any]]
    """``(target, rollout.environment_config) -> the adapter's config``; ValueError (one line, naming the key) when
    the two do not make one."""
    checks: tuple[Callable[[Mapping[str, Any]], None], ...]
    """validate's checks of the adapter's config, in order (a later one may assume the earlier passed); each raises
    :class:`~rlhfctl.recipe.errors.RecipeError` naming its key."""


#: The kinds ``rollout.environment`` knows, by name.
ENVIRONMENT_KINDS: dict[str, EnvironmentKind] = {
    "openenv": EnvironmentKind(
        name="openenv",
        extra="openenv",
        adapter="rlhfctl.environments.openenv_adapter:OpenEnvEnvironment",
        adapter_config=openenv_settings.adapter_config,
        checks=openenv_checks.CHECKS,
    ),
}
