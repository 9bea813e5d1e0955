"""Worker groups shared by the single-controller tests, one per (backend, world size), built once."""

from __future__ import annotations

import pytest

from rlhfctl.single_controller import LocalWorkerGroup, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.single_controller.sample_workers import EchoWorker


@pytest.fixture(scope="session")
def echo_groups(ray_session):
    """Factory: make_group(backend, world_size) -> an EchoWorker group, cached for the session."""
    cache, pools = {}, []

    def make_group(backend: str, world_size: int):
        key = (backend, world_size)
        if key not in cache:
            if backend == "ray":
                pool = RayResourcePool([world_size], name=f"echo{world_size}")
                pools.append(pool)
                cache[key] = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker, offset=7), role="echo")
            else:
                cache[key] = LocalWorkerGroup(world_size, RayClassWithInitArgs(EchoWorker, offset=7), role="echo")
        return cache[key]

    yield make_group
    for group in cache.values():
        group.shutdown()
    for pool in pools:
        pool.release()
