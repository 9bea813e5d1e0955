"""End-to-end training on a real local Ray with tiny models: learning, critic, LoRA and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhfctl.recipe import load_recipe
from rlhfctl.trainer import run_training

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def read_metrics(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def train(recipe: str, tmp_path: Path, *overrides: str) -> list[dict]:
    cfg = load_recipe(RECIPES / recipe, [f"trainer.output_dir={tmp_path}", *overrides])
    run_training(cfg)
    return read_metrics(tmp_path)


@pytest.mark.slow
def test_the_quickstart_command_learns_the_mean_reward_at_least_doubles(tmp_path):
    """The README's main command, as a user runs it: last 5 steps' mean reward >= 2x the first 5."""
    import subprocess
    import sys
    import time

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rlhfctl.cli", "train", "recipes/quickstart.yaml",
                           f"trainer.output_dir={tmp_path}"], cwd=RECIPES.parent, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 600
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == list(range(1, 41))
    first = sum(r["reward/mean"] for r in records[:5]) / 5
    last = sum(r["reward/mean"] for r in records[-5:]) / 5
    assert last >= 2 * first, (first, last)
    for key in ("reward/mean", "time/step", "response_length/mean", "actor/pg_loss", "actor/pg_clipfrac",
                "actor/entropy", "actor/grad_norm", "actor/lr", "actor/kl_loss", "time/generate",
                "time/update_actor", "perf/tokens_per_s"):
        assert key in records[-1], key
    assert "run finished" in done.stdout and "dispatch/orchestration" in done.stdout


def test_ppo_gae_with_a_critic_lowers_the_value_loss(ray_session, tmp_path):
    records = train("ppo-gae.yaml", tmp_path, "trainer.total_steps=12", "rollout.max_new_tokens=12")
    losses = [r["critic/vf_loss"] for r in records]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    last = records[-1]
    for key in ("critic/explained_variance", "values/mean", "kl", "reward/with_kl_mean", "time/old_log_prob",
                "time/update_critic", "critic/vf_clipfrac"):
        assert key in last, key


def test_lora_run_uses_the_adapter_disabled_actor_as_reference(ray_session, tmp_path):
    records = train("lora-ppo.yaml", tmp_path, "trainer.total_steps=3", "trainer.save_every=3",
                    "rollout.max_new_tokens=8")
    assert len(records) == 3
    # The KL loss compares against the reference: zero before the first update, then positive.
    assert records[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert records[-1]["actor/kl_loss"] > 0.0
    saved = tmp_path / "checkpoints" / "step_3" / "actor"
    assert (saved / "adapter").is_dir() and not (saved / "model.safetensors").exists()


def test_resumed_run_matches_an_uninterrupted_one(ray_session, tmp_path):
    common = ["rollout.max_new_tokens=8", "trainer.batch_size=4", "trainer.mini_batch_size=4", "trainer.save_every=2",
              "data.num_train=16"]
    straight = train("quickstart.yaml", tmp_path / "straight", "trainer.total_steps=4", *common)
    train("quickstart.yaml", tmp_path / "resumed", "trainer.total_steps=2", *common)
    resumed = train("quickstart.yaml", tmp_path / "resumed", "trainer.total_steps=4", "trainer.resume=auto", *common)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # every step logged exactly once
    for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean"):
        assert [r[key] for r in resumed] == pytest.approx([r[key] for r in straight], rel=1e-5, abs=1e-7), key


SHORT_RUN = ["rollout.max_new_tokens=8", "trainer.batch_size=4", "trainer.mini_batch_size=4", "trainer.total_steps=3",
             "data.num_train=16"]


def test_overlapping_the_next_rollout_changes_no_number(ray_session, tmp_path):
    """The next step's prompts are sent before the update returns; the ranks still generate after it."""
    overlapped = train("quickstart.yaml", tmp_path / "overlapped", "trainer.overlap_rollout=true", *SHORT_RUN)
    in_turn = train("quickstart.yaml", tmp_path / "in_turn", "trainer.overlap_rollout=false", *SHORT_RUN)
    for key in ("reward/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "response_length/mean"):
        assert [r[key] for r in overlapped] == [r[key] for r in in_turn], key


def test_a_reward_function_in_the_driver_scores_as_the_colocated_worker_does(ray_session, tmp_path):
    """roles.reward.pool=driver: same rewards and updates, with the reward's calls made in this process."""
    in_driver = train("quickstart.yaml", tmp_path / "driver", "roles.reward.pool=driver", "trainer.trace=true", *SHORT_RUN)
    on_pool = train("quickstart.yaml", tmp_path / "pool", "roles.reward.pool=main", *SHORT_RUN)
    for key in ("reward/mean", "actor/pg_loss", "actor/kl_loss", "response_length/mean"):
        assert [r[key] for r in in_driver] == [r[key] for r in on_pool], key
    events = json.loads((tmp_path / "driver" / "trace.json").read_text())["traceEvents"]
    on_ranks = [e for e in events if e.get("ph") == "X" and e["pid"] != 0]  # pid 0: the driver's dispatch spans
    reward_calls = [e for e in on_ranks if e["name"] == "reward.compute_rewards"]
    actor_calls = [e for e in on_ranks if e["name"] == "actor.generate_sequences"]
    assert reward_calls and actor_calls
    assert {e["pid"] for e in reward_calls}.isdisjoint({e["pid"] for e in actor_calls})
    tracks = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert {tracks[e["pid"]] for e in reward_calls} == {"workers: reward (driver process)"}


def test_turning_validation_on_changes_no_training_number(ray_session, tmp_path):
    """Validation draws from its own stream; its metrics come per data_source as well."""
    from rlhfctl.tasks.digits import make_prompts

    val_file = tmp_path / "val.jsonl"
    records = [{**record, "data_source": "short" if i % 2 else "long"} for i, record in enumerate(make_prompts(6, 5))]
    val_file.write_text("".join(json.dumps(record) + "\n" for record in records))
    validated = train("quickstart.yaml", tmp_path / "validated", "trainer.val_every=1", f"data.val_files=[{val_file}]",
                      *SHORT_RUN)
    plain = train("quickstart.yaml", tmp_path / "plain", "trainer.val_every=0", *SHORT_RUN)
    for key in ("reward/mean", "actor/pg_loss", "actor/kl_loss", "response_length/mean"):
        assert [r[key] for r in validated] == [r[key] for r in plain], key
    last = validated[-1]
    assert last["val/samples"] == 6 and last["val/short/samples"] == 3 and last["val/long/samples"] == 3
    halves = (last["val/short/reward/mean"] + last["val/long/reward/mean"]) / 2
    assert last["val/reward/mean"] == pytest.approx(halves)
    assert "val/reward/mean" not in plain[-1]
