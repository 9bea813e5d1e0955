"""Torch threads per worker process: whole CPUs reserved per process decide, else the cores are shared out."""

from __future__ import annotations

from pathlib import Path

from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.resolved import resolve
from rlhfctl.single_controller.host import torch_threads_for
from rlhfctl.trainer.role_groups import cpu_threads_per_process

QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"
SEPARATE = ["resource_pools.gen={process_on_nodes: [2], use_gpu: false}", "rollout.placement=separate", "rollout.pool=gen"]


def _threads(pool: str, *overrides: str) -> int | None:
    cfg = load_recipe(QUICKSTART, list(overrides))
    return cpu_threads_per_process(resolve(cfg), pool)


def test_a_pool_reserving_whole_cpus_per_process_runs_that_many_threads():
    assert _threads("main", "resource_pools.main.num_cpus_per_process=1") == 1
    assert _threads("main", "resource_pools.main.num_cpus_per_process=3") == 3


def test_otherwise_the_processes_of_every_pool_in_use_share_the_cores_the_rollout_pool_included():
    assert _threads("main") == torch_threads_for(1)
    assert _threads("main", *SEPARATE) == torch_threads_for(3)  # 1 on main + 2 rollout processes
    assert _threads("main", "resource_pools.main.num_cpus_per_process=0.5") == torch_threads_for(1)
    assert _threads("main", "ray.address=127.0.0.1:6379") is None
