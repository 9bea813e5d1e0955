"""Shared fixtures: one real local Ray for the whole session, shut down at the end."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every registered worker method fails if it writes in place into a batch it was sent (received
# tensors are zero-copy views of shared memory); set before Ray starts so the workers inherit it.
os.environ.setdefault("RLHFCTL_CHECK_INPUTS", "1")
# Ranks report progress from a call's first step (the run default waits a quarter second), so that the
# tests' short calls show their reports; set before Ray starts, like the line above.
os.environ.setdefault("RLHFCTL_PROGRESS_QUIET_S", "0")
# The tests read plain output as CI does: 120 columns off a terminal. pytest-xdist's workers inherit COLUMNS=80 and
# LINES=24 from execnet, which would make rich wrap the tables some tests read.
for _variable in ("COLUMNS", "LINES"):
    os.environ.pop(_variable, None)


@pytest.fixture(scope="session")
def ray_session():
    """A private local Ray (8 logical CPUs so several small pools fit on a 2-core machine)."""
    from rlhfctl.ray_cluster import start_or_join_ray

    session = start_or_join_ray(num_cpus=8, env_vars={"OMP_NUM_THREADS": "1"})
    yield session
    session.shutdown()

