"""The async-step benchmark's rules that keep its rows comparable: equal cores and threads, and trained samples.

Its old rows gave the colocated run one CPU and the separate runs two, so their ratio measured the second
core. These tests pin, without starting anything, that every configuration reserves the same cores and
threads in all, and that a partial run's rate counts the samples it trained, never a full batch it did not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def async_step():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import async_step as module
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def _reserved(overrides: list[str]) -> tuple[int, int]:
    """CPUs the pools reserve in all, and ray.num_cpus, read back from the overrides."""
    pools = sum(int(o.split("=")[1]) for o in overrides if o.startswith("resource_pools.main.num_cpus_per_process="))
    pools += sum(int(o.rsplit("num_cpus_per_process: ", 1)[1].rstrip("}")) for o in overrides
                 if o.startswith("resource_pools.gen="))
    ray_cpus = next(int(o.split("=")[1]) for o in overrides if o.startswith("ray.num_cpus="))
    return pools, ray_cpus


@pytest.mark.parametrize("cores", [2, 4])
def test_every_configuration_reserves_the_same_cores_and_threads(async_step, cores):
    for config in async_step.configs(1).values():
        overrides = async_step.placement_overrides(config, cores, partial_tokens=64)
        assert _reserved(overrides) == (cores, cores), config.label
        assert sum(async_step.expected_threads(config, cores).values()) == cores, config.label
        assert ("rollout.partial.max_tokens_per_step=64" in overrides) == config.partial


def test_a_partial_run_is_rated_by_the_samples_it_trained(async_step):
    partial = async_step.configs(1)["p-sep"]
    result = {"step_ends": [(1, 10.0), (2, 12.0), (3, 16.0)], "threads": {}, "affinity": {}, "wall_s": 20.0,
              "records": [{"step": s, async_step.TRAINED_SAMPLES_KEY: t} for s, t in [(1, 32), (2, 12), (3, 20)]]}
    summary = async_step.summarize(result, partial, warmup=1, full_batch=32)
    assert summary["trained_samples"] == [12, 20]
    assert summary["samples_per_s"] == pytest.approx(32 / 6.0)
    full = async_step.summarize(result, async_step.configs(1)["c"], warmup=1, full_batch=32)
    assert full["samples_per_s"] == pytest.approx(64 / 6.0)


def test_a_partial_run_without_its_trained_count_is_an_error_not_a_full_batch(async_step):
    partial = async_step.configs(1)["p-co"]
    result = {"step_ends": [(1, 1.0), (2, 2.0)], "threads": {}, "affinity": {}, "wall_s": 3.0,
              "records": [{"step": 1}, {"step": 2}]}
    with pytest.raises(RuntimeError, match=async_step.TRAINED_SAMPLES_KEY):
        async_step.summarize(result, partial, warmup=1, full_batch=32)


def test_a_run_whose_workers_ran_other_threads_than_its_row_claims_is_an_error(async_step):
    colocated, separate = async_step.configs(1)["a"], async_step.configs(1)["c"]
    ran = {"threads": {"actor": [1], "rollout": [1]}, "affinity": {"actor": [[0, 1]], "rollout": [[0, 1]]}}
    async_step.check_threads(separate, ran, cores=2, cpus=[0, 1])
    with pytest.raises(RuntimeError, match="claims 2"):
        async_step.check_threads(colocated, ran, cores=2, cpus=[0, 1])
    with pytest.raises(RuntimeError, match="outside"):
        async_step.check_threads(separate, {**ran, "affinity": {"actor": [[0, 1, 2]]}}, cores=2, cpus=[0, 1])


def test_the_benchmarks_built_on_its_runs_import_what_it_offers(async_step):
    """rollout_precision.py and partial_learning.py reuse async_step's runs; a rename there broke one silently once."""
    import importlib

    precision = importlib.import_module("rollout_precision")
    learning = importlib.import_module("partial_learning")
    assert precision.COLOCATED.key == "a" and not precision.COLOCATED.separate
    records = [{"step": 1, "reward/mean": 0.0, "rollout/partial/trained_samples": 16.0},
               {"step": 2, "reward/mean": 1.0, "val/reward/mean": 0.5, "rollout/partial/trained_samples": 32.0}]
    # samples 9-40: 8 of step 1's (reward 0) and 24 of step 2's (reward 1); only step 2 validated
    assert learning.reward_at(records, 32, until=40.0, window=32.0) == pytest.approx((8 * 0.0 + 24 * 1.0) / 32)
    assert learning.reward_at(records, 32, until=40.0, window=32.0, key="val/reward/mean") == 0.5


def test_the_long_tail_comparison_with_trl_gives_both_sides_the_same_work_and_cores(async_step):
    """vs_trl_long_tail.py: every row on the same cores and threads, TRL on the same task, lengths and steps."""
    import argparse
    import importlib

    long_tail = importlib.import_module("vs_trl_long_tail")
    args = argparse.Namespace(trl_python=Path("/venv/bin/python"), model_path=Path("/sft/model"), task="repeat",
                              max_new_tokens=256, steps=24, warmup=4, partial=32, partial_staleness=8, cores=2)
    for row in long_tail.ROWS.values():
        if row.is_trl:
            command = long_tail.trl_command(row, args, Path("out.json"))
            flags = dict(zip(command[2::2], command[3::2]))
            assert flags["--threads"] == "2" and flags["--steps"] == "20" and flags["--warmup"] == "4"
            assert flags["--task"] == "repeat" and flags["--max-new-tokens"] == "256" and flags["--beta"] == "0.001"
            assert ("--bf16" in command) == row.trl_bf16
            continue
        overrides = long_tail.our_overrides(row, args, base=["trainer.seed=0"])
        assert _reserved(overrides) == (2, 2), row.label
        assert ("rollout.dtype=bfloat16" in overrides) == ("bf16" in row.key)
        assert ("rollout.partial.max_tokens_per_step=32" in overrides) == row.key.startswith("p-")


def test_trl_is_rated_by_its_timed_steps_full_batches(async_step):
    import importlib

    long_tail = importlib.import_module("vs_trl_long_tail")
    result = {"all_step_seconds": [9.0, 2.0, 3.0, 5.0], "all_generate_seconds": [4.0, 1.0, 2.0, 3.0],
              "completion_chars": [30.0, 4.0, 6.0, 8.0], "torch_threads": 2}
    rated = long_tail.trl_rate(result, warmup=1, full_batch=32)
    assert rated["samples_per_s"] == pytest.approx(96 / 10.0)
    assert (rated["s_per_step"], rated["time/generate"], rated["response_length/mean"]) == (3.0, 2.0, 6.0)
    with pytest.raises(RuntimeError, match="timed no step"):
        long_tail.trl_rate(result, warmup=4, full_batch=32)
