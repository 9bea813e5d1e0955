"""Runs that heal themselves (trainer.max_restarts), driven through the real CLI with faults from outside.

A fault comes as a real one would: ``kill -9`` of the rank's process, or ``SIGSTOP`` for a hang, the pid
read from the run's own process table (``workers.json``, which the groups write at setup). The moment
is made exact by :mod:`tests.reliability.pausing_actor`, which holds the rank still at a chosen call
and says so in a file. Each run has a Ray temp dir of its own, so no Ray process may outlive a test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.reliability.test_faults import QUICK, REPO, sigint_not_ignored, wait_for
from tests.reliability.test_signals import processes_under, ray_tmpdir  # noqa: F401 - the fixture

PAUSING = "roles.actor.worker=tests.reliability.pausing_actor.PausingActor"
TEN_STEPS = ["trainer.total_steps=10", "trainer.save_every=2", "trainer.log_samples=1", PAUSING]


def launch(output_dir: Path, ray_tmpdir: str, *overrides: str, pauses: str = "", pause_rank: int = 0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": ray_tmpdir, "RLHFCTL_TEST_PAUSES": pauses,
           "RLHFCTL_TEST_PAUSE_RANK": str(pause_rank), "RLHFCTL_TEST_PAUSE_DIR": str(output_dir.parent)}
    env.pop("RAY_ADDRESS", None)
    with sigint_not_ignored():
        return subprocess.Popen(
            [sys.executable, "-m", "rlhfctl.cli", "train", "recipes/quickstart.yaml", f"trainer.output_dir={output_dir}",
             *QUICK, *overrides], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def paused_pid(output_dir: Path, index: int, process: subprocess.Popen, role: str = "actor", rank: int = 0) -> int:
    """Wait for pause ``index``; the pid of ``role`` rank ``rank`` from the run's workers.json (the paused process)."""
    marker = output_dir.parent / f"pause_{index}"
    wait_for(marker.exists, 240, f"pause {index}", process)
    pid = json.loads((output_dir / "workers.json").read_text())[role][rank]["pid"]
    assert pid == int(marker.read_text())  # the process table names the process that holds still
    return pid


def finish(process: subprocess.Popen, ray_tmpdir: str, timeout: float = 420) -> str:
    output, _ = process.communicate(timeout=timeout)
    wait_for(lambda: not processes_under(ray_tmpdir), 30, "the private Ray's processes to exit")
    return output


def steps_of(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def assert_same_checkpoint(straight: Path, healed: Path) -> None:
    """Every file byte-equal, but DCP's index (which names the directory it was written in): its entries equal, and the
    manifest (which holds the index's size): the same files."""
    names = sorted(str(p.relative_to(straight)) for p in straight.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(healed)) for p in healed.rglob("*") if p.is_file())
    for name in names:
        if name.endswith(".metadata"):
            from torch.distributed.checkpoint import FileSystemReader

            index = [FileSystemReader(str((root / name).parent)).read_metadata() for root in (straight, healed)]
            assert index[0].state_dict_metadata == index[1].state_dict_metadata, name
        elif name == "complete.json":
            listed = [json.loads((root / name).read_text())["files"].keys() for root in (straight, healed)]
            assert listed[0] == listed[1]
        else:
            assert (straight / name).read_bytes() == (healed / name).read_bytes(), name


def healed_run_matches_a_straight_one(tmp_path: Path, ray_tmpdir: str, pauses: str, pause_rank: int,
                                      role: str, *overrides: str) -> str:
    """A 10-step run whose paused rank is killed, beside one never interrupted; returns the healed run's output."""
    straight = launch(tmp_path / "straight" / "run", ray_tmpdir, *TEN_STEPS, *overrides)
    assert straight.wait(timeout=420) == 0, straight.stdout.read()
    (tmp_path / "healed").mkdir()
    healed = launch(tmp_path / "healed" / "run", ray_tmpdir, *TEN_STEPS, "trainer.max_restarts=1", *overrides,
                    pauses=pauses, pause_rank=pause_rank)
    os.kill(paused_pid(tmp_path / "healed" / "run", 0, healed, role, pause_rank), signal.SIGKILL)
    output = finish(healed, ray_tmpdir)
    assert healed.returncode == 0, output
    run = tmp_path / "healed" / "run"
    assert_same_checkpoint(tmp_path / "straight" / "run" / "checkpoints" / "step_10", run / "checkpoints" / "step_10")
    assert steps_of(run / "metrics.jsonl") == list(range(1, 11))  # each step once: the redone ones replaced the lost
    assert steps_of(run / "samples.jsonl") == list(range(1, 11))
    return output


@pytest.mark.slow
def test_a_worker_killed_in_the_update_of_step_5_restarts_and_ends_bit_equal_to_a_straight_run(tmp_path, ray_tmpdir):
    output = healed_run_matches_a_straight_one(tmp_path, ray_tmpdir, "update_actor:5", 0, "actor",
                                               "trainer.loggers=[console,jsonl,tensorboard]", "trainer.trace=true")
    # The dispatch summary (and trace.json) count the whole run, each step once, the attempt before the restart too.
    from rlhfctl.trace import summarize_trace

    for run in ("straight", "healed"):
        summary = summarize_trace(tmp_path / run / "run")
        assert summary["steps"] == 10 and summary["methods"]["actor.update_actor"]["calls"] == 10, (run, summary)
    line = next(line for line in output.splitlines() if "restart 1/1" in line)
    assert "after step 4: actor rank 0 lost during actor.update_actor (process died)" in line, line
    assert "checkpoints/step_2" in line  # step 4 was still being written when its process died
    records = [json.loads(line) for line in (tmp_path / "healed" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("run/restarts") for r in records] == [None, None] + [1.0] * 8
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "healed" / "run" / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("reward/mean")] == list(range(1, 11))
    assert [event.step for event in events.Scalars("run/restarts")] == list(range(3, 11))


@pytest.mark.slow
def test_a_rank_killed_in_the_generation_of_step_5_at_world_2_ends_bit_equal_to_a_straight_run(tmp_path, ray_tmpdir):
    output = healed_run_matches_a_straight_one(tmp_path, ray_tmpdir, "generate_sequences:5", 1, "actor",
                                               "resource_pools.main.process_on_nodes=[2]")
    assert "actor rank 1 lost during actor.generate_sequences (process died)" in output, output


@pytest.mark.slow
def test_a_worker_killed_during_a_checkpoint_save_restarts_from_the_one_before(tmp_path, ray_tmpdir):
    run = tmp_path / "run"
    process = launch(run, ray_tmpdir, "trainer.total_steps=6", "trainer.save_every=2", "trainer.max_restarts=1",
                     PAUSING, pauses="save_checkpoint:2")  # the save of step 4
    os.kill(paused_pid(run, 0, process), signal.SIGKILL)
    output = finish(process, ray_tmpdir)
    assert process.returncode == 0, output
    assert "after step 4: actor rank 0 lost during actor.save_checkpoint (process died)" in output
    assert "starting fresh workers from " + str(run / "checkpoints" / "step_2") in output
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_6"


@pytest.mark.slow
def test_a_hung_worker_is_caught_by_the_call_timeout_and_restarted(tmp_path, ray_tmpdir):
    run = tmp_path / "run"
    process = launch(run, ray_tmpdir, "trainer.total_steps=6", "trainer.save_every=2", "trainer.max_restarts=1",
                     "trainer.call_timeout_s=20", PAUSING, pauses="update_actor:5")
    pid = paused_pid(run, 0, process)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: json.loads((run / "workers.json").read_text())["actor"][0]["pid"] != pid, 240,
                 "fresh workers", process)
    finally:
        for signum in (signal.SIGCONT, signal.SIGKILL):  # no stopped process is left behind
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
    output = finish(process, ray_tmpdir)
    assert process.returncode == 0, output
    assert "after step 4: actor rank 0 lost during actor.update_actor (no answer within trainer.call_timeout_s=20 s)" in output
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_a_second_failure_with_max_restarts_1_exits_3_listing_both(tmp_path, ray_tmpdir):
    run = tmp_path / "run"
    process = launch(run, ray_tmpdir, "trainer.total_steps=6", "trainer.save_every=2", "trainer.max_restarts=1",
                     PAUSING, pauses="update_actor:3,generate_sequences:2")
    os.kill(paused_pid(run, 0, process), signal.SIGKILL)
    os.kill(paused_pid(run, 1, process), signal.SIGKILL)
    output = finish(process, ray_tmpdir)
    assert process.returncode == 3, output
    error = next(line for line in output.splitlines() if line.startswith("error:"))
    assert "trainer.max_restarts=1 used up; 2 worker failure(s)" in error, error
    assert "[1] after step 2: actor rank 0 lost during actor.update_actor (process died)" in error
    assert "[2] after step 1: actor rank 0 lost during actor.generate_sequences (process died)" in error
    assert "Traceback" not in output


@pytest.mark.slow
def test_a_driver_killed_mid_checkpoint_and_a_half_deleted_checkpoint_resume_from_the_last_complete_one(
        tmp_path, ray_tmpdir):
    run = tmp_path / "run"
    driver = launch(run, ray_tmpdir, "trainer.total_steps=6", "trainer.save_every=2", PAUSING,
                    pauses="save_checkpoint:2")  # the driver is writing step 4
    paused_pid(run, 0, driver)
    driver.kill()
    finish(driver, ray_tmpdir)  # the private Ray goes with its driver
    assert (run / "checkpoints" / "step_4.tmp").is_dir()
    resumed = launch(run, ray_tmpdir, "trainer.total_steps=6", "trainer.save_every=2", "trainer.resume=auto")
    output = finish(resumed, ray_tmpdir)
    assert resumed.returncode == 0, output
    assert f"resumed from {run / 'checkpoints' / 'step_2'} at step 2" in output
    assert steps_of(run / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]
    newest = run / "checkpoints" / "step_6"
    (newest / "actor" / "state" / "__0_0.distcp").unlink()  # step 6 deleted halfway: its state shard is gone
    again = launch(run, ray_tmpdir, "trainer.total_steps=8", "trainer.save_every=2", "trainer.resume=auto")
    output = finish(again, ray_tmpdir)
    assert again.returncode == 0, output
    assert f"resumed from {run / 'checkpoints' / 'step_4'} at step 4" in output
    assert steps_of(run / "metrics.jsonl") == list(range(1, 9))
