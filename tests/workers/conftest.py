"""Fixtures for the worker tests: worker groups on the local backend, built and torn down per use."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.workers.recipes import tiny_recipe
from workers import ActorWorker


@contextlib.contextmanager
def local_group(worker_cls: type, recipe: dict[str, Any], role: str, init: bool = True) -> Iterator[LocalWorkerGroup]:
    """A one-rank LocalWorkerGroup of ``worker_cls(recipe, role)``, initialised, shut down afterwards."""
    group = LocalWorkerGroup(1, ClassWithInitArgs(worker_cls, recipe, role), role=role)
    try:
        if init:
            group.init_model()
        yield group
    finally:
        group.shutdown()


@contextlib.contextmanager
def ray_role_group(worker_cls: type, recipe: dict[str, Any], role: str, name: str, world: int = 2) -> Iterator[RayWorkerGroup]:
    """A RayWorkerGroup of ``world`` ranks of ``worker_cls(recipe, role)`` on a pool of its own, initialised; its
    processes and the pool's resources are released afterwards."""
    pool = RayResourcePool([world], name=name)
    group = None
    try:
        group = RayWorkerGroup(pool, RayClassWithInitArgs(worker_cls, recipe, role), role=role)
        group.init_model()
        yield group
    finally:
        if group is not None:
            group.shutdown()
        pool.release()


@pytest.fixture(scope="module")
def actor_group() -> Iterator[LocalWorkerGroup]:
    """A shared actor for read-only tests (generation, log-probs): never updated."""
    with local_group(ActorWorker, tiny_recipe(), "actor") as group:
        yield group
