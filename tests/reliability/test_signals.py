"""Operations through the real CLI: stop signals save and exit, a private Ray stays private, one run per output_dir.

Each run gets a Ray temp dir of its own (RAY_TMPDIR), so the clusters here never meet the other Ray
clusters of this machine, and a leftover process of a run can be found by that path.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.reliability.test_faults import QUICK, REPO, logged_steps, wait_for

CLI = [sys.executable, "-m", "rlhfctl.cli", "train", "recipes/quickstart.yaml"]


@pytest.fixture
def ray_tmpdir():
    """A short, private RAY_TMPDIR (Ray's socket paths must stay under ~107 characters)."""
    path = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    yield path
    stop_processes_under(path)
    shutil.rmtree(path, ignore_errors=True)


def processes_under(path: str) -> list[psutil.Process]:
    """Processes whose command line names ``path`` (the Ray processes of a cluster with that temp dir)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(path in part for part in process.info["cmdline"] or []):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def stop_processes_under(path: str) -> None:
    """Stop exactly the processes of the cluster rooted at ``path``, and their children."""
    targets = processes_under(path)
    for process in list(targets):
        try:
            targets += process.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for process in targets:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(targets, timeout=15)
    for process in alive:
        process.kill()


def launch(output_dir: Path, ray_tmpdir: str, *overrides: str, new_session: bool = False) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": ray_tmpdir}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([*CLI, f"trainer.output_dir={output_dir}", *QUICK, *overrides], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=new_session)


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def assert_no_leftovers(processes: list[psutil.Process], ray_tmpdir: str) -> None:
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert alive == [], f"left behind: {[p.pid for p in alive]}"
    assert processes_under(ray_tmpdir) == []


def stop_after_two_steps(tmp_path: Path, ray_tmpdir: str, signum: int, to_group: bool) -> tuple[int, str, int]:
    """Run, send ``signum`` after two logged steps; returns (exit code, output, the step of checkpoints/latest)."""
    process = launch(tmp_path, ray_tmpdir, "trainer.total_steps=500", new_session=to_group)
    wait_for(lambda: logged_steps(tmp_path) >= 2, 240, "two steps", process)
    children = descendants(process.pid)
    assert children, "the driver started no Ray processes"
    if to_group:
        os.killpg(process.pid, signum)  # start_new_session: the driver leads its own process group
    else:
        os.kill(process.pid, signum)
    output, _ = process.communicate(timeout=180)
    assert_no_leftovers(children, ray_tmpdir)
    latest = (tmp_path / "checkpoints" / "latest").read_text().strip()
    return process.returncode, output, int(latest.split("_")[1])


@pytest.mark.slow
def test_sigterm_to_the_driver_saves_exits_143_and_resume_logs_each_step_once(tmp_path, ray_tmpdir):
    code, output, saved = stop_after_two_steps(tmp_path, ray_tmpdir, signal.SIGTERM, to_group=False)
    assert code == 143, output
    assert "stopped by SIGTERM" in output and f"saving step {saved}" in output
    assert "SIGTERM received" not in output and "Traceback" not in output
    assert saved >= 2
    resumed = launch(tmp_path, ray_tmpdir, f"trainer.total_steps={saved + 1}", "trainer.resume=auto")
    output, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, output
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, saved + 2))


@pytest.mark.slow
def test_sigusr1_to_the_process_group_saves_and_exits_138(tmp_path, ray_tmpdir):
    code, output, saved = stop_after_two_steps(tmp_path, ray_tmpdir, signal.SIGUSR1, to_group=True)
    assert code == 128 + signal.SIGUSR1, output
    assert "stopped by SIGUSR1" in output and "Traceback" not in output and "logging.cc" not in output
    assert saved >= 2 and (tmp_path / "checkpoints" / f"step_{saved}" / "trainer_state.json").exists()


@pytest.mark.slow
def test_sigterm_to_the_process_group_reaches_the_driver_alone(tmp_path, ray_tmpdir):
    code, output, saved = stop_after_two_steps(tmp_path, ray_tmpdir, signal.SIGTERM, to_group=True)
    assert code == 143, output  # not 130: a signal handled while the driver waits in ray.get (test_signal_order)
    assert f"stopped by SIGTERM: saving step {saved} before exiting" in output
    assert "SIGTERM received" not in output and "Traceback" not in output
    assert saved >= 2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_a_private_ray_ignores_another_cluster_on_the_machine(tmp_path, ray_tmpdir):
    env = {**os.environ, "RAY_TMPDIR": ray_tmpdir}
    env.pop("RAY_ADDRESS", None)
    ray_cli = str(Path(sys.executable).with_name("ray"))
    started = subprocess.run([ray_cli, "start", "--head", f"--port={free_port()}", "--num-cpus=1",
                              "--include-dashboard=false", "--disable-usage-stats"],
                             env=env, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr
    assert (Path(ray_tmpdir) / "ray" / "ray_current_cluster").exists()  # what a bare ray.init() would join
    other = processes_under(ray_tmpdir)
    process = launch(tmp_path / "run", ray_tmpdir, "trainer.total_steps=1")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert "_system_config must not be provided" not in output
    assert "Token authentication is enabled" not in output
    assert all(p.is_running() for p in other), "the other cluster must stay up"


def test_a_used_output_dir_is_refused_before_anything_starts(tmp_path, ray_tmpdir):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 7)))
    (tmp_path / "checkpoints" / "step_6").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest").write_text("step_6")
    started = time.monotonic()
    process = launch(tmp_path, ray_tmpdir, "trainer.total_steps=1")
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 2, output
    assert "trainer.output_dir" in output and "already holds a run" in output
    for choice in ("trainer.resume=auto", "another trainer.output_dir", "trainer.overwrite=true"):
        assert choice in output
    assert "Traceback" not in output and processes_under(ray_tmpdir) == []  # Ray never started
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 6
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_overwrite_clears_the_previous_run_first(tmp_path, ray_tmpdir):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 7)))
    (tmp_path / "checkpoints" / "step_6").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest").write_text("step_6")
    (tmp_path / "notes.txt").write_text("mine")  # not a run file: kept
    process = launch(tmp_path, ray_tmpdir, "trainer.total_steps=2", "trainer.overwrite=true", "ray.backend=local")
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert not (tmp_path / "checkpoints" / "latest").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"
