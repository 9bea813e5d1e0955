"""DAPO's recipe end to end on a real local Ray: dynamic sampling, the overlong buffer, named rewards, gdpo, pass@k."""

from __future__ import annotations

import pytest

from tests.trainer.test_training_runs import train

SMALL = ["rollout.max_new_tokens=8", "roles.reward.overlong_buffer.len=4", "trainer.batch_size=4",
         "trainer.mini_batch_size=4", "data.num_train=32"]


@pytest.mark.slow
def test_the_dapo_quickstart_learns_while_it_filters_groups(ray_session, tmp_path):
    """The bundled recipe as shipped: 30 steps; groups are dropped and refilled, and the reward rises."""
    records = train("dapo-quickstart.yaml", tmp_path)
    assert [r["step"] for r in records] == list(range(1, 31))
    assert all(r["filter/kept_groups"] <= 8 for r in records)
    assert any(r["filter/gen_batches"] > 1 and r["filter/dropped_fraction"] > 0 for r in records)
    assert records[0]["reward/overlong_penalty/mean"] < 0  # a random policy rarely stops: most responses overrun
    first = sum(r["reward/mean"] for r in records[:5]) / 5
    last = sum(r["reward/mean"] for r in records[-5:]) / 5
    assert last >= first + 0.3, (first, last)
    for key in ("reward/acc/mean", "reward/digit_fraction/mean", "actor/pg_clipfrac"):
        assert key in records[-1], key


def test_a_resumed_dapo_run_matches_an_uninterrupted_one(ray_session, tmp_path):
    """The extra generation batches draw from the one prompt stream that checkpoints hold: resume is step-exact."""
    common = [*SMALL, "trainer.save_every=2"]
    straight = train("dapo-quickstart.yaml", tmp_path / "straight", "trainer.total_steps=4", *common)
    train("dapo-quickstart.yaml", tmp_path / "resumed", "trainer.total_steps=2", *common)
    resumed = train("dapo-quickstart.yaml", tmp_path / "resumed", "trainer.total_steps=4", "trainer.resume=auto", *common)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert sum(r["filter/gen_batches"] for r in straight) > 4  # the filter did draw extra batches
    for key in ("reward/mean", "filter/kept_groups", "filter/gen_batches", "actor/pg_loss", "response_length/mean"):
        assert [r[key] for r in resumed] == pytest.approx([r[key] for r in straight], rel=1e-5, abs=1e-7), key


def test_gdpo_trains_on_named_rewards_and_validation_reports_pass_at_k(ray_session, tmp_path):
    records = train("dapo-quickstart.yaml", tmp_path, *SMALL, "trainer.total_steps=2", "algorithm.adv_estimator=gdpo",
                    "algorithm.gdpo_reward_keys=[acc,digit_fraction]", "algorithm.gdpo_reward_weights=[1.0,0.5]",
                    "algorithm.filter_groups.enable=false", "trainer.val_every=2", "data.num_val=4", "rollout.val_n=3")
    last = records[-1]
    assert 0.0 <= last["val/pass@3"] <= 1.0 and last["val/samples"] == 12  # 4 prompts x 3 responses
    assert "filter/kept_groups" not in last
    for record in records:  # gdpo whitens the summed advantages over the batch's response tokens
        assert record["advantages/mean"] == pytest.approx(0.0, abs=1e-5)
