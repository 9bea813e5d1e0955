"""validate's checks of ``rollout.environment: openenv:...``, in the order they run; each raises a RecipeError whose
one line names the key.

The extra is installed; the adapter builds from its config; a client class imports and says which Action it sends;
the server answers ``/health`` within :data:`HEALTH_TIMEOUT_S`; the action has the one text field the model's turn
fills. A URL target needs no openenv import for any of them (a client class does: seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rlhfctl.environments.openenv_client import INSTALL_HINT, action_maker, openenv_installed, server_json, typed_action
from rlhfctl.environments.openenv_settings import CONFIG_KEY, OpenEnvSettings
from rlhfctl.recipe.errors import RecipeError

__all__ = ["CHECKS", "HEALTH_TIMEOUT_S", "check_action", "check_client", "check_health", "check_installed", "check_settings"]

KEY = "rollout.environment"
HEALTH_TIMEOUT_S = 3.0


def check_installed(config: Mapping[str, Any]) -> None:
    """openenv-core is installed: else the extra to install."""
    if not openenv_installed():
        raise RecipeError(f"{KEY}: openenv needs the openenv-core package: {INSTALL_HINT}", KEY, "missing")


def check_settings(config: Mapping[str, Any]) -> None:
    """The adapter builds from its config (``rollout.environment_config`` and the target): every key known and typed."""
    from rlhfctl.environments.openenv_adapter import OpenEnvEnvironment  # the agents package: only for this kind

    try:
        OpenEnvEnvironment(**config)
    except ValueError as error:
        message = str(error)
        raise RecipeError(message, message.split(":", 1)[0] if message.startswith(CONFIG_KEY) else CONFIG_KEY, "invalid") from None


def check_client(config: Mapping[str, Any]) -> None:
    """A client class (``openenv:module:Class``) imports, is an OpenEnv ``EnvClient`` and declares its Action."""
    typed_action(OpenEnvSettings.from_config(config))


def check_health(config: Mapping[str, Any]) -> None:
    """The server answers ``GET /health`` with ``healthy`` within :data:`HEALTH_TIMEOUT_S`."""
    settings = OpenEnvSettings.from_config(config)
    url = f"{settings.http_url}/health"
    try:
        status = server_json(url, HEALTH_TIMEOUT_S)
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise RecipeError(f"{KEY}: the OpenEnv server at {settings.base_url} does not answer {url} within "
                          f"{HEALTH_TIMEOUT_S:g} s ({type(error).__name__}: {reason}); start it, or fix the URL", KEY, "invalid") from None
    if not isinstance(status, Mapping) or status.get("status") != "healthy":
        raise RecipeError(f"{KEY}: the OpenEnv server at {settings.base_url} is not healthy: {url} says {status!r}", KEY, "invalid")


def check_action(config: Mapping[str, Any]) -> None:
    """The action has one text field for the model's turn (see :mod:`rlhfctl.environments.openenv_text`)."""
    settings = OpenEnvSettings.from_config(config)
    try:
        action_maker(settings, typed_action(settings))
    except OSError as error:
        raise RecipeError(f"{KEY}: cannot read {settings.http_url}/schema: {type(error).__name__}: {error}", KEY, "invalid") from None
    except ValueError as error:
        raise RecipeError(f"{KEY}: {error}", KEY, "invalid") from None


#: In order: each later check assumes the earlier passed.
CHECKS: tuple[Callable[[Mapping[str, Any]], None], ...] = (check_installed, check_settings, check_client, check_health, check_action)
