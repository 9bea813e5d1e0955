"""OpenEnv's side of the adapter: the client class a config names, the action it sends, and a server's JSON endpoints.

Shared by the adapter (each rollout worker) and validate's checks, so both read the same class, the same action
field and the same server. openenv is imported inside the functions: it is an optional extra, and importing it
takes seconds (its server side pulls in gradio).
"""

from __future__ import annotations

import json
import typing
import urllib.request
from collections.abc import Callable
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit

from rlhfctl.environments.openenv_settings import OpenEnvSettings
from rlhfctl.environments.openenv_text import text_action_field
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.importing import import_class

__all__ = [
    "INSTALL_HINT",
    "action_class",
    "action_maker",
    "action_schema",
    "client_class",
    "openenv_installed",
    "server_json",
    "typed_action",
]

KEY = "rollout.environment"
INSTALL_HINT = "pip install 'rlhfctl[openenv]'"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def openenv_installed() -> bool:
    """Whether the openenv-core distribution is installed (read from its metadata: importing it is slow)."""
    try:
        metadata.version("openenv-core")
    except metadata.PackageNotFoundError:
        return False
    return True


def client_class(settings: OpenEnvSettings) -> type:
    """The ``EnvClient`` subclass to talk through: ``settings.client``, else OpenEnv's ``GenericEnvClient``;
    RecipeError naming ``rollout.environment`` when openenv is missing or the class is not a client."""
    if not openenv_installed():
        raise RecipeError(f"{KEY}: openenv needs the openenv-core package: {INSTALL_HINT}", KEY, "missing")
    from openenv.core.env_client import EnvClient  # the optional extra, seconds to import: only once it is used

    if settings.client is None:
        from openenv.core.generic_client import GenericEnvClient

        return GenericEnvClient
    try:
        cls = import_class(settings.client, KEY)
    except RecipeError as error:
        raise RecipeError(f"{error} (openenv:<target> is a server URL, http://host:port, or an OpenEnv client class, "
                          "module:Class)", KEY, "import") from None
    if not issubclass(cls, EnvClient):
        raise RecipeError(f"{KEY}: {settings.client!r} is not an OpenEnv client (a subclass of openenv.core.EnvClient)",
                          KEY, "invalid")
    return cls


def action_class(client_cls: type) -> type | None:
    """The typed Action a client sends, read from its declaration ``EnvClient[Action, Observation, State]``; None for
    OpenEnv's ``GenericEnvClient`` (plain dicts) or a client that does not declare it."""
    from openenv.core.env_client import EnvClient  # the optional extra (see client_class)

    for klass in client_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            if isinstance(origin, type) and issubclass(origin, EnvClient):
                first = (typing.get_args(base) or (None,))[0]
                if isinstance(first, type) and hasattr(first, "model_json_schema"):
                    return first
    return None


def server_json(url: str, timeout_s: float) -> Any:
    """GET ``url`` and parse its JSON (a loopback host bypasses any proxy); OSError or ValueError on failure."""
    host = urlsplit(url).hostname or ""
    handlers = [urllib.request.ProxyHandler({})] if host in _LOOPBACK else []
    with urllib.request.build_opener(*handlers).open(url, timeout=timeout_s) as response:
        return json.loads(response.read().decode("utf-8"))


def typed_action(settings: OpenEnvSettings) -> type | None:
    """The Action class of ``settings.client`` (None without one: OpenEnv's ``GenericEnvClient`` sends dicts);
    RecipeError naming ``rollout.environment`` when the class does not say which Action it sends."""
    if settings.client is None:
        return None
    cls = client_class(settings)
    typed = action_class(cls)
    if typed is None:
        raise RecipeError(f"{KEY}: {settings.client!r} does not say which Action it sends: declare it as "
                          "EnvClient[MyAction, MyObservation, State]", KEY, "invalid")
    return typed


def action_schema(settings: OpenEnvSettings, typed: type | None) -> tuple[dict[str, Any], str]:
    """The JSON schema of the action, and how to name it in messages: the typed Action class's, else the server's
    ``/schema`` (OSError or ValueError when that cannot be read)."""
    if typed is not None:
        return typed.model_json_schema(), f"{typed.__name__} (the action of {settings.client})"
    url = f"{settings.http_url}/schema"
    return dict(server_json(url, settings.connect_timeout_s).get("action") or {}), f"the action of {settings.base_url}"


def action_maker(settings: OpenEnvSettings, typed: type | None) -> Callable[[str], Any]:
    """``text -> action`` for the client's ``step``: the typed Action with its text field set, or ``{field: text}``
    (see :mod:`rlhfctl.environments.openenv_text` for which field); ValueError when no field fits."""
    schema, source = action_schema(settings, typed)
    field = text_action_field(schema, settings.action_field, source)
    if typed is None:
        return lambda text: {field: text}
    return lambda text: typed(**{field: text})
