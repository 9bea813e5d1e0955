"""Faults driven through the real CLI: a killed worker, Ctrl-C, a NaN reward, and a 2-node cluster."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QUICK = ["rollout.max_new_tokens=8", "trainer.batch_size=4", "trainer.mini_batch_size=4", "data.num_train=16"]


@contextlib.contextmanager
def sigint_not_ignored() -> Iterator[None]:
    """A suite started in the background (``cmd &`` in a script) runs with SIGINT ignored, and a child
    inherits that: Python then never turns Ctrl-C into KeyboardInterrupt. A handled signal is reset to
    the default at exec, so the child starts as it would from a terminal."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def launch(output_dir: Path, *overrides: str, recipe: str = "recipes/quickstart.yaml") -> subprocess.Popen:
    """Start `rlhfctl train` as a user would from a terminal, with plain (non-terminal) output."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with sigint_not_ignored():
        return subprocess.Popen(
            [sys.executable, "-m", "rlhfctl.cli", "train", recipe, f"trainer.output_dir={output_dir}", *QUICK, *overrides],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )


def wait_for(predicate, timeout: float, what: str, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if process is not None and process.poll() is not None:
            raise AssertionError(f"training exited ({process.returncode}) before {what}:\n{process.stdout.read()}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def logged_steps(output_dir: Path) -> int:
    path = output_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def worker_pids(output_dir: Path) -> dict[str, list[int]]:
    placement = json.loads((output_dir / "workers.json").read_text())
    return {role: [rank["pid"] for rank in ranks] for role, ranks in placement.items()}


def assert_processes_gone(pids: list[int], timeout: float = 30.0) -> None:
    def all_gone() -> bool:
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            return False
        return True

    wait_for(all_gone, timeout, f"worker processes {pids} to exit")


@pytest.mark.slow
def test_a_killed_worker_is_reported_with_role_and_rank_and_the_run_exits_3(tmp_path):
    process = launch(tmp_path, "trainer.total_steps=500")
    wait_for(lambda: logged_steps(tmp_path) >= 1, 180, "the first step", process)
    pid = worker_pids(tmp_path)["actor"][0]
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 3, output
    assert time.monotonic() - killed_at < 120
    assert "rank 0 died during" in output
    assert any(f"{role}" in output for role in ("actor", "reference", "reward"))
    assert "Traceback" not in output
    assert_processes_gone([pid for pids in worker_pids(tmp_path).values() for pid in pids])


@pytest.mark.slow
def test_ctrl_c_saves_exits_130_leaves_no_workers_and_resume_continues(tmp_path):
    process = launch(tmp_path, "trainer.total_steps=500", "trainer.save_on_interrupt=true")
    wait_for(lambda: logged_steps(tmp_path) >= 2, 180, "two steps", process)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "Traceback" not in output
    assert_processes_gone([pid for pids in worker_pids(tmp_path).values() for pid in pids])
    latest = (tmp_path / "checkpoints" / "latest").read_text().strip()
    saved_step = int(latest.split("_")[1])
    assert saved_step >= 2
    resumed = launch(tmp_path, f"trainer.total_steps={saved_step + 1}", "trainer.resume=auto")
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, saved_step + 2))  # every step exactly once


@pytest.mark.slow
def test_a_nan_reward_stops_with_the_function_and_sample_and_keeps_the_checkpoint(tmp_path):
    reward_file = tmp_path / "nan_after_two_calls.py"
    counter = tmp_path / "calls.txt"
    reward_file.write_text(
        "from pathlib import Path\n"
        f"COUNTER = Path({str(counter)!r})\n"
        "def score(prompts, responses, **columns):\n"
        "    calls = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1\n"
        "    COUNTER.write_text(str(calls))\n"
        "    return [float('nan') if calls > 2 and i == 1 else 0.5 for i in range(len(responses))]\n"
    )
    process = launch(tmp_path / "run", "trainer.total_steps=5", "trainer.save_every=1",
                     f"roles.reward.function={reward_file}:score")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 2, output
    assert "non-finite score" in output and "sample 1" in output and "score" in output
    assert "Traceback" not in output
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step_2"


@pytest.mark.slow
def test_two_node_cluster_places_ranks_on_different_nodes_and_stays_up(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    try:
        process = launch(tmp_path, "trainer.total_steps=2", f"ray.address={cluster.address}",
                         "resource_pools.main.process_on_nodes=[1,1]")
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output
        placement = json.loads((tmp_path / "workers.json").read_text())
        nodes = [rank["node_id"] for rank in placement["actor"]]
        assert len(nodes) == 2 and nodes[0] != nodes[1]
        assert [rank["rank"] for rank in placement["actor"]] == [0, 1]
        # The run joined the cluster; it must not have shut it down.
        probe = subprocess.run(
            [sys.executable, "-c", f"import ray; ray.init(address={cluster.address!r}); print(len(ray.nodes()))"],
            capture_output=True, text=True, timeout=120,
        )
        assert probe.stdout.strip().splitlines()[-1] == "2", probe.stderr
    finally:
        cluster.shutdown()
