"""Fixtures for the worker tests: worker groups on the local backend, built and torn down per use."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from rlhfctl.single_controller import ClassWithInitArgs, LocalWorkerGroup
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


@pytest.fixture(scope="module")
def actor_group() -> Iterator[LocalWorkerGroup]:
    """A shared actor for read-only tests (generation, log-probs): never updated."""
    with local_group(ActorWorker, tiny_recipe(), "actor") as group:
        yield group
