"""A real OpenEnv server of the guess-the-digit environment on 127.0.0.1, shared by the tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def guess_url() -> Iterator[str]:
    """The URL of a running guess-the-digit OpenEnv server (up to 32 concurrent sessions)."""
    pytest.importorskip("openenv.core", reason="the openenv extra: pip install 'rlhfctl[openenv]'")
    from tests.environments.guess_env import guess_server

    with guess_server() as url:
        yield url
