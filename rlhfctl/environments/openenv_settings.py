"""What ``rollout.environment: openenv:<target>`` and ``rollout.environment_config`` mean for the OpenEnv adapter.

The target is a server's URL (``http://host:port``, with an optional ``?action_field=...&observation_field=...``
query) or an OpenEnv client class (``module:Class``, an ``EnvClient`` subclass; its server at
``environment_config.base_url``, default ``http://127.0.0.1:8000``). :func:`adapter_config` merges the two into the
config the adapter is built with; :meth:`OpenEnvSettings.from_config` reads it back, the same in validate and in
every rollout worker. Nothing here imports openenv.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

__all__ = ["CONFIG_KEY", "DEFAULT_BASE_URL", "QUERY_KEYS", "OpenEnvSettings", "adapter_config"]

CONFIG_KEY = "rollout.environment_config"
DEFAULT_BASE_URL = "http://127.0.0.1:8000"
"""Where a client class's server is when ``environment_config.base_url`` does not say (OpenEnv servers' own port)."""
QUERY_KEYS = ("action_field", "observation_field")
"""The settings a URL target may carry in its query."""
_SCHEMES = ("http", "https", "ws", "wss")


@dataclass(frozen=True)
class OpenEnvSettings:
    """The OpenEnv adapter's settings (each one a key of ``rollout.environment_config``)."""

    base_url: str = DEFAULT_BASE_URL
    client: str | None = None
    """``module:Class`` of an OpenEnv ``EnvClient`` subclass; None: OpenEnv's ``GenericEnvClient`` (plain dicts)."""
    action_field: str | None = None
    """The action's field the model's turn text goes in; None: the action's only string field."""
    observation_field: str | None = None
    """The observation's field shown to the model; None: its only string field, else all its fields as JSON."""
    reset_columns: tuple[str, ...] = ()
    """Dataset columns passed to the server's ``reset`` as keyword arguments (e.g. a seed or the task's answer)."""
    reset_observation: bool = False
    """Whether ``reset``'s observation continues the prompt (false: the dataset prompt says everything)."""
    connect_timeout_s: float = 10.0
    message_timeout_s: float = 60.0
    """Seconds one reply of the server may take (``step`` is also bound by ``rollout.multi_turn.tool_timeout_s``)."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> OpenEnvSettings:
        """The settings of an adapter config; ValueError naming ``rollout.environment_config.<key>`` when one is wrong."""
        names = [item.name for item in dataclasses.fields(cls)]
        unknown = sorted(set(config) - set(names))
        if unknown:
            raise ValueError(f"{CONFIG_KEY}: unknown key {unknown[0]!r} for openenv (its keys: {', '.join(names)})")
        values: dict[str, Any] = {}
        for name, value in config.items():
            values[name] = _typed(name, value, getattr(cls, name) if name != "reset_columns" else ())
        settings = cls(**values)
        for name in ("connect_timeout_s", "message_timeout_s"):
            if getattr(settings, name) <= 0:
                raise ValueError(f"{CONFIG_KEY}.{name}: must be > 0, got {getattr(settings, name)!r}")
        return settings

    @property
    def http_url(self) -> str:
        """``base_url`` as http(s), for the server's ``/health`` and ``/schema``."""
        scheme, rest = self.base_url.split("://", 1)
        return {"ws": "http", "wss": "https"}.get(scheme, scheme) + "://" + rest


def _typed(name: str, value: Any, default: Any) -> Any:
    key = f"{CONFIG_KEY}.{name}"
    if name == "reset_columns":
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            raise ValueError(f"{key}: expected a list of column names, got {value!r}")
        return tuple(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{key}: expected true or false, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key}: expected a number of seconds, got {value!r}")
        return float(value)
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def adapter_config(target: str, environment_config: Mapping[str, Any]) -> dict[str, Any]:
    """The adapter's config for ``openenv:<target>`` and ``rollout.environment_config``: a URL's base and query, or a
    client class; ValueError (one line) when the two give one setting twice or the query has an unknown key."""
    config = dict(environment_config)
    parts = urlsplit(target)
    if parts.scheme not in _SCHEMES:
        config["client"] = target  # module:Class; validate says so when it does not import
        return config
    if not parts.netloc:
        raise ValueError(f"rollout.environment: {target!r} has no host; write openenv:http://host:port")
    for given in ("base_url", "client"):
        if given in config:
            raise ValueError(f"{CONFIG_KEY}.{given}: rollout.environment already names the server ({target!r}); drop one")
    config["base_url"] = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in QUERY_KEYS:
            raise ValueError(f"rollout.environment: unknown query key {name!r} in {target!r} (the query may set: "
                             f"{', '.join(QUERY_KEYS)}; other settings go in {CONFIG_KEY})")
        if name in config and config[name] != value:
            raise ValueError(f"{CONFIG_KEY}.{name}: also set to {value!r} in rollout.environment's query; keep one")
        config[name] = value
    return config
