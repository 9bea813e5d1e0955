"""rollout.placement: separate end to end on a real local Ray: a rollout group of its own, weights over a channel.

- k = 0 gives the colocated run's numbers, step for step, and resumes step-exact;
- k = 1 overlaps generation with the update (the trace shows it), with batches one version old, and a
  run resumed from a checkpoint taken with batches in flight trains on the same prompts;
- under a slow update and under a slow rollout no sample is older than k versions, with an FSDP2
  actor of two ranks whose gathered shards reach the rollout engine intact, and the off-policy
  corrections weigh the older samples by their behaviour log-probs;
- a rollout worker that dies is restarted alone: at k = 0 the run's numbers are those of a run where
  nothing died, at k = 1 it trains on the same prompts.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.trainer.test_training_runs import train

SEPARATE = ["resource_pools.gen={process_on_nodes: [1], use_gpu: false}", "rollout.placement=separate", "rollout.pool=gen"]
RUN = ["rollout.max_new_tokens=8", "trainer.batch_size=4", "trainer.mini_batch_size=4", "data.num_train=32",
       "trainer.total_steps=4", "trainer.log_samples=4"]
COMPARED = ("reward/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "response_length/mean")


def _prompts(output_dir: Path) -> dict[int, list[str]]:
    steps: dict[int, list[str]] = {}
    for line in (output_dir / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(int(record["step"]), []).append(record["prompt"])
    return steps


def _resume_from_step_2(straight: Path, resumed: Path, *overrides: str) -> list[dict]:
    """A fresh output dir resumed from ``straight``'s step-2 checkpoint, run to step 4."""
    checkpoint = straight / "checkpoints" / "step_2"
    assert checkpoint.is_dir()
    return train("quickstart.yaml", resumed, *overrides, f"trainer.resume={checkpoint}")


ON_POLICY = [*RUN, "trainer.save_every=2", "trainer.keep_last=0"]


@pytest.fixture(scope="module")
def on_policy_runs(ray_session, tmp_path_factory) -> dict[str, tuple[Path, list[dict]]]:
    """A colocated run and a separate k = 0 run of the same 4 steps (checkpoints at 2 and 4), shared by the tests."""
    root = tmp_path_factory.mktemp("on_policy")
    runs = {"colocated": [*ON_POLICY], "separate": [*SEPARATE, *ON_POLICY, "rollout.sync_check_every=1"]}
    return {name: (root / name, train("quickstart.yaml", root / name, *overrides)) for name, overrides in runs.items()}


def test_on_policy_separate_rollout_matches_colocated_and_resumes_step_exact(on_policy_runs, tmp_path):
    (_, colocated), (separate_dir, separate) = on_policy_runs["colocated"], on_policy_runs["separate"]
    for key in COMPARED:
        assert [r[key] for r in separate] == [r[key] for r in colocated], key
    assert [r["rollout/staleness/max"] for r in separate] == [0.0] * 4
    for record in separate:  # the probe after every sync: the engine scores as the actor does (float32)
        assert record["rollout/sync_check_diff"] < 1e-5
        assert record["rollout/sync_bytes"] > 0 and record["time/weight_sync"] > 0
    resumed = _resume_from_step_2(separate_dir, tmp_path / "resumed", *SEPARATE, *ON_POLICY)
    assert [r["step"] for r in resumed] == [3, 4]
    for key in COMPARED:
        assert [r[key] for r in resumed] == pytest.approx([r[key] for r in separate[2:]], rel=1e-6, abs=1e-8), key


def test_one_step_off_policy_overlaps_rollout_with_the_update_and_resumes_with_batches_in_flight(ray_session, tmp_path):
    pools = ["resource_pools.rw={process_on_nodes: [1], use_gpu: false}", "roles.reward.pool=rw"]
    common = [*RUN, *SEPARATE, *pools, "trainer.max_staleness=1", "rollout.stream_chunks=2", "trainer.save_every=2",
              "trainer.keep_last=0"]
    straight_dir = tmp_path / "straight"
    # Each chunk takes 0.5 s more, so a step's generation outlasts the driver's turnaround between two updates.
    straight = train("quickstart.yaml", straight_dir, *common, "trainer.trace=true",
                     "rollout.worker=tests.trainer.slow_workers.SlowRollout")
    assert [r["rollout/staleness/max"] for r in straight] == [0.0, 1.0, 1.0, 1.0]
    events = json.loads((straight_dir / "trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and e["pid"] != 0]

    def named(name: str) -> list[tuple[float, float]]:
        return [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] == name]

    generations, updates = named("rollout.generate_sequences"), named("actor.update_actor")
    assert len(generations) == 8 and len(updates) == 4  # 2 chunks a step
    overlap = sum(max(0.0, min(g1, u1) - max(g0, u0)) for g0, g1 in generations for u0, u1 in updates)
    assert overlap > 0, "no generation ran while the actor updated"
    rewards = named("reward.compute_rewards")
    first_step_generations = sorted(generations)[:2]
    assert min(start for start, _ in rewards) < first_step_generations[1][1]  # chunk 1 rewarded while chunk 2 generates
    resumed = _resume_from_step_2(straight_dir, tmp_path / "resumed", *common)
    assert [r["step"] for r in resumed] == [3, 4]
    straight_prompts, resumed_prompts = _prompts(straight_dir), _prompts(tmp_path / "resumed")
    assert [resumed_prompts[3], resumed_prompts[4]] == [straight_prompts[3], straight_prompts[4]]
    assert [r["rollout/staleness/max"] for r in resumed] == [0.0, 1.0]  # the resumed run refills its pipeline


@pytest.mark.parametrize("slow", ["update", "rollout"])
def test_no_sample_is_older_than_the_bound_under_a_slow_update_or_a_slow_rollout(ray_session, tmp_path, slow):
    worker = ("roles.actor.worker=tests.trainer.slow_workers.SlowUpdateActor" if slow == "update"
              else "rollout.worker=tests.trainer.slow_workers.SlowRollout")
    # Each with an off-policy correction on the behaviour log-probs the hf rollout group returns: truncated
    # importance sampling, or decoupled PPO (behaviour, proximal and current policy).
    extra = (["resource_pools.main.process_on_nodes=[2]", "roles.actor.strategy=fsdp2", "rollout.sync_check_every=1",
              "rollout.importance_cap=2.0"]
             if slow == "update" else ["rollout.sync_every=2", "roles.actor.policy_loss=decoupled_ppo"])
    records = train("quickstart.yaml", tmp_path, *RUN, *SEPARATE, worker, *extra, "trainer.max_staleness=2",
                    "trainer.total_steps=5", "trainer.log_samples=0")
    ages = [r["rollout/staleness/max"] for r in records]
    assert max(ages) <= 2 and ages[:2] == [0.0, 1.0]
    weights = [r["actor/behav_imp_weight/mean"] for r in records]
    assert weights[0] == pytest.approx(1.0, abs=1e-5)  # on-policy at step 1: the engine is the actor
    assert any(abs(weight - 1.0) > 1e-4 for weight in weights[2:])  # older samples weigh other than 1
    if slow == "update":
        assert ages == [0.0, 1.0, 2.0, 2.0, 2.0]  # the pipeline fills to the bound
        # Shards gathered on both actor ranks, sent by rank 0: the engine has the same weights. Syncs stop once
        # every batch is sent (the last ones after step 2 here), so the later steps log none.
        checked = [r["rollout/sync_check_diff"] for r in records if "rollout/sync_check_diff" in r]
        assert len(checked) >= 3 and max(checked) < 1e-5


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_lost_rollout_worker_is_restarted_alone(on_policy_runs, tmp_path, staleness):
    """Its third generation call kills the rollout process; the run heals without a checkpoint."""
    overrides = [*SEPARATE, *ON_POLICY, f"trainer.max_staleness={staleness}", "trainer.max_restarts=1",
                 "rollout.worker=tests.trainer.slow_workers.DyingRollout"]
    dying = train("quickstart.yaml", tmp_path / "dying", *overrides)
    assert (tmp_path / "died").exists()
    assert [r["step"] for r in dying] == [1, 2, 3, 4]
    assert dying[-1]["rollout/restarts"] == 1.0
    assert all("run/restarts" not in r for r in dying)  # the trainer itself never restarted
    intact_dir, intact = on_policy_runs["separate"]
    assert _prompts(tmp_path / "dying") == _prompts(intact_dir)  # no prompt skipped or repeated
    if staleness == 0:  # the lost batch is drawn again from the same weights with the same random stream
        for key in COMPARED:
            assert [r[key] for r in dying] == [r[key] for r in intact], key
