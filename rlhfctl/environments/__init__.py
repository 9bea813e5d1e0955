"""Environments from the ecosystem, named in a recipe: ``rollout.environment: <kind>:<target>``.

A kind (``openenv`` today) is one entry of :data:`~rlhfctl.environments.kinds.ENVIRONMENT_KINDS`: it says which
extra installs its client, which :class:`~rlhfctl.agents.Environment` adapter speaks its protocol, how the target
and ``rollout.environment_config`` become that adapter's config, and which checks ``rlhfctl validate`` runs.

:func:`~rlhfctl.environments.choice.environment_choice` reads the key once, where the recipe is resolved, and the
rollout runs the adapter as its ``rollout.multi_turn.environment`` (the :class:`~rlhfctl.agents.loop.EnvironmentAgentLoop`):
the workers see one effective multi-turn environment, whichever key named it. The names below are imported on
first use, so ``import rlhfctl.environments`` stays light.
"""

from __future__ import annotations

from rlhfctl.lazy_exports import lazy_exports

__all__ = ["ENVIRONMENT_KINDS", "EnvironmentChoice", "EnvironmentKind", "OpenEnvEnvironment", "environment_choice"]

__getattr__ = lazy_exports(
    __name__,
    {
        "ENVIRONMENT_KINDS": "rlhfctl.environments.kinds",
        "EnvironmentKind": "rlhfctl.environments.kinds",
        "EnvironmentChoice": "rlhfctl.environments.choice",
        "environment_choice": "rlhfctl.environments.choice",
        "OpenEnvEnvironment": "rlhfctl.environments.openenv_adapter",
    },
)
