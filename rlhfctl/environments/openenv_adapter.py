"""An OpenEnv environment as an rlhfctl :class:`~rlhfctl.agents.Environment` (``rollout.environment: openenv:...``).

One instance per trajectory, one session on the server: ``reset`` opens the client's session (OpenEnv's
WebSocket protocol, ``/ws``) and resets the environment, each ``step`` sends the turn's text as the action and
returns the observation's text, the reward (0 when the server gives none) and ``done``, and ``close`` ends the
session. Every trajectory of a rank's shard is in flight at once, so the server must accept that many concurrent
sessions (OpenEnv's ``max_concurrent_envs``). How text becomes an action and an observation text:
:mod:`rlhfctl.environments.openenv_text`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from rlhfctl.agents.environment import Environment
from rlhfctl.environments.openenv_client import action_maker, client_class, typed_action
from rlhfctl.environments.openenv_settings import OpenEnvSettings
from rlhfctl.environments.openenv_text import observation_text

__all__ = ["OpenEnvEnvironment", "OpenEnvSessionError"]

_CLOSE_WAIT_S = 2.0
"""Seconds ``close`` waits for the server to end a session before closing the socket itself."""
_PROTOCOLS: dict[OpenEnvSettings, tuple[type, Callable[[str], Any]]] = {}
"""The client class and action maker of each settings, found once per process (an import and a /schema read)."""


class OpenEnvSessionError(RuntimeError):
    """The OpenEnv server refused or lost a trajectory's session (the message names the server and what to do)."""


class OpenEnvEnvironment(Environment):
    """One trajectory's episode in an OpenEnv environment, over the server's own protocol (its client class)."""

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.settings = OpenEnvSettings.from_config(config)
        self.client: Any = None
        self._action: Callable[[str], Any] | None = None

    async def reset(self, **columns: Any) -> str:
        """Open a session and reset the environment (with the ``reset_columns`` of the sample); the first observation's
        text when ``reset_observation`` is on, else ``""``."""
        client_cls, self._action = await _protocol(self.settings)
        settings = self.settings
        missing = [name for name in settings.reset_columns if name not in columns]
        if missing:
            raise ValueError(f"rollout.environment_config.reset_columns: the sample has no column {missing[0]!r} "
                             f"(its columns: {', '.join(sorted(columns))})")
        arguments = {name: _plain(columns[name]) for name in settings.reset_columns}
        self.client = client_cls(base_url=settings.base_url, connect_timeout_s=settings.connect_timeout_s,
                                 message_timeout_s=settings.message_timeout_s)
        try:
            result = await self.client.reset(**arguments)
        except Exception as error:  # the server's or the connection's failure, said with what to do
            raise OpenEnvSessionError(_session_problem(settings, error)) from error
        return observation_text(result.observation, settings.observation_field) if settings.reset_observation else ""

    async def step(self, action_text: str) -> tuple[str, float, bool]:
        """Send the turn's text as the action; ``(observation text, reward or 0, done)``."""
        if self.client is None or self._action is None:
            raise RuntimeError("OpenEnvEnvironment.step before reset")
        result = await self.client.step(self._action(action_text))
        text = observation_text(result.observation, self.settings.observation_field)
        return text, float(result.reward or 0.0), bool(result.done)

    async def close(self) -> None:
        """End the session (the server frees the episode's environment)."""
        if self.client is None:
            return
        client, self.client = self.client, None
        connection = getattr(client, "_ws", None)
        if connection is not None:
            # Say "close" and let the server close the socket first: OpenEnv's client closes it right after sending,
            # and the server then logs a traceback for every episode as it fails to close an already closed socket.
            with contextlib.suppress(Exception):
                await client._send({"type": "close"})
                await asyncio.wait_for(connection.wait_closed(), _CLOSE_WAIT_S)
        await client.close()


async def _protocol(settings: OpenEnvSettings) -> tuple[type, Callable[[str], Any]]:
    cached = _PROTOCOLS.get(settings)
    if cached is None:
        # off the event loop: openenv's import takes seconds and /schema is a blocking read
        cached = await asyncio.to_thread(_load_protocol, settings)
        _PROTOCOLS[settings] = cached
    return cached


def _load_protocol(settings: OpenEnvSettings) -> tuple[type, Callable[[str], Any]]:
    client_cls = client_class(settings)
    try:
        return client_cls, action_maker(settings, typed_action(settings))
    except OSError as error:
        raise OpenEnvSessionError(f"rollout.environment: cannot read {settings.http_url}/schema: "
                                  f"{type(error).__name__}: {error}") from error


def _session_problem(settings: OpenEnvSettings, error: Exception) -> str:
    text = f"rollout.environment: the OpenEnv server at {settings.base_url} failed a session's reset: {type(error).__name__}: {error}"
    if "CAPACITY_REACHED" in str(error):
        text += "; it accepts fewer concurrent sessions than the trajectories in flight"
    elif type(error).__name__.startswith("ConnectionClosed"):  # websockets: a full server may close before its reply is read
        text += "; a server that accepts fewer concurrent sessions than the trajectories in flight closes them so"
    else:
        return text
    return text + " (trainer.batch_size * rollout.n / actor ranks): raise its max_concurrent_envs"


def _plain(value: Any) -> Any:
    """A dataset column's value as JSON (numpy scalars and arrays included), for the server's reset."""
    return json.loads(json.dumps(value, default=lambda item: item.tolist() if hasattr(item, "tolist") else str(item)))
