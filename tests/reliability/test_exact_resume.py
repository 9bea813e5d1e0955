"""Every way a run stops, resumed, gives the metrics of a run that never stopped, value for value.

A run is stopped again and again at different points of a step, each time with another signal, and
resumed from its checkpoint each time (``trainer.resume=auto``); its metrics.jsonl must equal an
uninterrupted run's, step for step, every value but timings. The points: before the step's first call
(the driver), during generation, during scoring (the reward, the reference pass), during the update, and
during a save; the ways: SIGTERM, SIGUSR1, Ctrl-C, and a worker lost with no restart left (the run fails;
the resumed run starts from its last periodic checkpoint). Colocated, on a rollout group of its own at
``trainer.max_staleness`` 0, with dynamic sampling, and with the agent loop.

A stop waits for the step in progress to end, then saves it (``rlhfctl.run_signals.step_in_progress``), so the
checkpoint a stop leaves is the one a periodic save of that step leaves. With ``max_staleness`` >= 1 the batches
in flight then are drawn again on the newer weights the checkpoint holds: the resumed run trains on the same
prompts, each step logged once, within the staleness bound, but not on the same samples. That guarantee is
tested from such a checkpoint in tests/trainer/test_separate_rollout_runs.py (k = 1, resumed with batches in
flight) and tests/trainer/test_separate_dapo_runs.py, and documented in docs/operations.md.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from rlhfctl.errors import WorkerLost
from rlhfctl.recipe import load_recipe
from rlhfctl.trainer import run_training
from rlhfctl.trainer.checkpoint import read_latest
from tests.reliability.stop_points import StopReporter, fired, write_plan
from tests.reliability.test_faults import sigint_not_ignored
from tests.trainer.test_training_runs import RECIPES, read_metrics

STOPPING = "tests.reliability.stop_points"
SMALL = ["rollout.max_new_tokens=8", "trainer.batch_size=4", "trainer.mini_batch_size=4", "data.num_train=32",
         "trainer.log_samples=4", "trainer.max_restarts=0", f"roles.actor.worker={STOPPING}.StoppingActor",
         f"roles.reward.worker={STOPPING}.StoppingReward"]
QUICKSTART = [*SMALL, f"roles.reference.worker={STOPPING}.StoppingReference"]
SEPARATE = ["resource_pools.gen={process_on_nodes: [1], use_gpu: false}", "rollout.placement=separate", "rollout.pool=gen",
            f"rollout.worker={STOPPING}.StoppingRollout"]
ECHO = "{class: 'tests.agents.test_agent_loop:EchoTool', config: {sleep_s: 0.01}}"
AGENT = [(f"rollout.multi_turn={{enable: true, max_turns: 3, max_response_tokens: 48, max_tool_response_tokens: 16, "
          f"format: test_always_echo, tools: [{ECHO}]}}"), "rollout.n=2"]
TIMING = ("time/", "perf/")  # and any latency: timings aside
LOST = "lost"  # a stop that is a worker process ending, not a signal
SAME = "same"  # a stop that saves nothing: the checkpoint resumed from stays the latest


def _cfg(recipe: str, output_dir: Path, overrides: list[str]):
    return load_recipe(RECIPES / recipe, [f"trainer.output_dir={output_dir}", "trainer.resume=auto", *overrides])


def _train(recipe: str, output_dir: Path, overrides: list[str]) -> StopReporter:
    reporter = StopReporter(output_dir)
    run_training(_cfg(recipe, output_dir, overrides), reporter)
    return reporter


def _latest(output_dir: Path) -> int:
    """The step ``trainer.resume=auto`` resumes from (the newest whole checkpoint)."""
    return int(read_latest(output_dir).name.split("_")[1])


def stopped_run(recipe: str, output_dir: Path, overrides: list[str], at: str, call: int,
                how: list[int] | str) -> tuple[BaseException, StopReporter]:
    """One segment of the run, armed to stop at the ``call``-th ``at`` (signals ``how``, or a lost worker)."""
    write_plan(output_dir, at, call, [] if how == LOST else how, exit=how == LOST)
    reporter = StopReporter(output_dir)
    with sigint_not_ignored(), pytest.raises((KeyboardInterrupt, WorkerLost)) as raised:
        run_training(_cfg(recipe, output_dir, overrides), reporter)
    assert fired(output_dir), f"the stop at {at} #{call} never fired"
    (output_dir / "stop_plan.fired").unlink()
    return raised.value, reporter


def run_with_stops(recipe: str, output_dir: Path, overrides: list[str], stops: list[tuple], total: int) -> list[str]:
    """Stop and resume at each of ``stops`` (where, which call of it in that segment, how, the step left saved: a
    step, the steps it may be, None for the one after the last saved, or SAME) in turn, then run to the end; returns the
    messages of every segment."""
    messages, latest = [], 0
    for at, call, how, saved in stops:
        error, reporter = stopped_run(recipe, output_dir, overrides, at, call, how)
        messages += reporter.messages
        assert isinstance(error, WorkerLost if how == LOST else KeyboardInterrupt), error
        expected = ((latest + 1,) if saved is None else (latest,) if saved == SAME
                    else saved if isinstance(saved, tuple) else (saved,))
        latest = _latest(output_dir)
        assert latest in expected, (at, reporter.messages)
    messages += _train(recipe, output_dir, overrides).messages
    assert _latest(output_dir) == total
    return messages


def comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING) and "latency" not in k} for r in records]


def assert_same_run(resumed: Path, straight: Path) -> None:
    records, expected = read_metrics(resumed), read_metrics(straight)
    assert [r["step"] for r in records] == [r["step"] for r in expected]  # each step logged once
    for got, want in zip(comparable(records), comparable(expected)):
        assert got.keys() == want.keys(), got["step"]
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9), got["step"]


def prompts_by_step(output_dir: Path) -> dict[int, list[str]]:
    steps: dict[int, list[str]] = {}
    for line in (output_dir / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(int(record["step"]), []).append(record["prompt"])
    return steps


@pytest.mark.slow
def test_colocated_run_stopped_at_every_point_of_a_step_resumes_exactly(ray_session, tmp_path):
    overrides = [*QUICKSTART, "trainer.total_steps=10", "trainer.save_every=3", "trainer.keep_last=0"]
    stops = [
        ("driver.step_started", 2, [signal.SIGTERM], 2),              # before step 2's first call
        ("actor.generate_sequences", 1, [signal.SIGUSR1], 3),         # during step 3's generation
        ("reward.compute_rewards", 1, [signal.SIGINT], 4),            # during step 4's scoring (Ctrl-C)
        ("reference.compute_ref_log_prob", 1, [signal.SIGTERM], 5),   # during step 5's reference pass
        # Step 7's update: the actor dies and no restart is left. Step 6's periodic save may still have been writing
        # in the actor's background thread; then it is lost with the process and step 5's checkpoint is kept.
        ("actor.update_actor", 2, LOST, (5, 6)),
        # A second request during the next step's update stops it at once: nothing is saved, the last checkpoint stays.
        ("actor.update_actor", 1, [signal.SIGTERM, signal.SIGTERM], SAME),
        ("actor.update_actor", 1, [signal.SIGUSR1], None),            # during the next step's update (6 or 7)
        ("actor.save_checkpoint", 1, [signal.SIGTERM], 9),            # during step 9's periodic save
    ]
    _train("quickstart.yaml", tmp_path / "straight", overrides)
    messages = run_with_stops("quickstart.yaml", tmp_path / "stopped", overrides, stops, total=10)
    assert_same_run(tmp_path / "stopped", tmp_path / "straight")
    assert ("SIGTERM: finishing step 2, then saving it; send it again to stop at once (the checkpoint of step 0 is "
            "kept then)") in messages
    assert any(m.startswith("Ctrl-C: finishing step 4") for m in messages)
    assert any(m.startswith("stopped by SIGTERM inside step ") and "its state is partial, so it is not saved; the "
               "checkpoint of step" in m for m in messages)


@pytest.mark.slow
def test_dynamic_sampling_and_the_agent_loop_resume_exactly_after_stops(tmp_path):
    dapo = ["rollout.max_new_tokens=8", "roles.reward.overlong_buffer.len=4", "trainer.batch_size=4",
            "trainer.mini_batch_size=4", "data.num_train=32", f"roles.actor.worker={STOPPING}.StoppingActor",
            f"roles.reward.worker={STOPPING}.StoppingReward", "trainer.total_steps=4", "trainer.save_every=4",
            "ray.backend=local"]
    _train("dapo-quickstart.yaml", tmp_path / "dapo_straight", dapo)
    run_with_stops("dapo-quickstart.yaml", tmp_path / "dapo", dapo, [
        ("actor.generate_sequences", 2, [signal.SIGINT], 1),  # a second generation: step 1's extra batch or step 2's
        ("actor.update_actor", 2, [signal.SIGTERM], 3),
    ], total=4)
    assert sum(r["filter/gen_batches"] for r in read_metrics(tmp_path / "dapo")) > 4  # the filter drew extra batches
    assert_same_run(tmp_path / "dapo", tmp_path / "dapo_straight")

    agent = [*QUICKSTART, *AGENT, "trainer.total_steps=3", "trainer.save_every=3", "ray.backend=local"]
    _train("quickstart.yaml", tmp_path / "agent_straight", agent)
    run_with_stops("quickstart.yaml", tmp_path / "agent", agent, [
        ("actor.generate_sequences", 1, [signal.SIGUSR1], 1),
        ("actor.update_actor", 1, [signal.SIGTERM], 2),
    ], total=3)
    assert read_metrics(tmp_path / "agent")[0]["agent/tool_calls/mean"] > 0
    assert_same_run(tmp_path / "agent", tmp_path / "agent_straight")


@pytest.mark.slow
def test_a_rollout_group_of_its_own_at_k0_resumes_exactly(ray_session, tmp_path):
    on_policy = [*QUICKSTART, *SEPARATE, "trainer.total_steps=4", "trainer.save_every=4"]
    _train("quickstart.yaml", tmp_path / "k0_straight", on_policy)
    run_with_stops("quickstart.yaml", tmp_path / "k0", on_policy, [
        # Step 2's batch: sent behind step 1's update and its weight sync, so the driver is still in step 1 or has
        # begun step 2 when it starts; the step it is in is the one saved.
        ("rollout.generate_sequences", 2, [signal.SIGUSR1], (1, 2)),
        ("actor.update_actor", 1, [signal.SIGTERM], None),
    ], total=4)
    assert_same_run(tmp_path / "k0", tmp_path / "k0_straight")
