"""The once-a-run warning when the trained tokens were sampled far from the actor's policy (``rollout/logprob_diff``).

The corrections cap or mask ratios; a user whose carried or stale tokens sit tenths of a nat off-policy is told so, with
the keys to change, once, not every step. End to end: a rollout group one version behind at a learning rate that moves
the tiny policy far in one update.
"""

from __future__ import annotations

from typing import Any

import pytest

from rlhfctl.recipe import load_recipe
from rlhfctl.trainer import run_training
from rlhfctl.trainer.off_policy_gap import FAR_NATS, OffPolicyGapWatch, far_off_policy
from tests.trainer.test_separate_rollout_runs import SEPARATE
from tests.trainer.test_training_runs import RECIPES, read_metrics


def test_a_gap_at_or_below_the_threshold_or_none_logged_says_nothing():
    assert far_off_policy(3, {}) is None
    assert far_off_policy(3, {"rollout/logprob_diff": FAR_NATS}) is None
    assert far_off_policy(3, {"rollout/logprob_diff": 1.3e-3, "rollout/partial/staleness/mean": 0.5}) is None
    assert far_off_policy(3, {"rollout/logprob_diff": float("nan")}) is None


def test_a_far_gap_names_the_step_the_gap_and_what_to_lower():
    stale = far_off_policy(7, {"rollout/logprob_diff": 0.4, "rollout/partial/staleness/mean": 0.52})
    assert stale.startswith("step 7: rollout/logprob_diff is 0.4 nats per token (above 0.1)")
    assert "0.52 versions old" in stale and "roles.actor.optim.lr" in stale and "trainer.max_staleness" in stale
    separate = far_off_policy(2, {"rollout/logprob_diff": 0.25, "rollout/staleness/mean": 1.0})
    assert "1.00 versions old" in separate and "roles.actor.optim.lr" in separate
    fresh = far_off_policy(2, {"rollout/logprob_diff": 0.25, "rollout/staleness/mean": 0.0})  # same version: the engine
    assert "rollout.dtype" in fresh and "roles.actor.optim.lr" not in fresh


def test_the_watch_warns_on_the_first_far_step_only():
    watch = OffPolicyGapWatch()
    near, far = {"rollout/logprob_diff": 0.01}, {"rollout/logprob_diff": 0.5, "rollout/staleness/mean": 1.0}
    assert [watch.check(step, m) is not None for step, m in [(1, near), (2, far), (3, far), (4, near), (5, far)]] == [
        False, True, False, False, False]


class _Messages:
    """A reporter that keeps the run's messages (and ignores its other events)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def message(self, text: str, level: str = "info") -> None:
        self.lines.append((level, text))

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@pytest.mark.slow
def test_a_run_one_version_behind_at_a_large_learning_rate_is_warned_once(ray_session, tmp_path):
    messages = _Messages()
    cfg = load_recipe(RECIPES / "quickstart.yaml", [
        f"trainer.output_dir={tmp_path}", *SEPARATE, "trainer.max_staleness=1", "rollout.importance_cap=2.0",
        "rollout.max_new_tokens=8", "trainer.batch_size=4", "trainer.mini_batch_size=4", "data.num_train=32",
        "trainer.total_steps=4", "trainer.save_every=0", "roles.actor.optim.lr=5e-2"])
    run_training(cfg, messages)
    gaps = [record["rollout/logprob_diff"] for record in read_metrics(tmp_path)]
    assert gaps[0] < 1e-5 and all(gap > FAR_NATS for gap in gaps[1:])  # step 1 is on-policy, the rest one behind
    warned = [text for level, text in messages.lines if level == "warning" and "rollout/logprob_diff" in text]
    assert len(warned) == 1 and warned[0].startswith("step 2: rollout/logprob_diff is")
    assert "1.00 versions old" in warned[0] and "roles.actor.optim.lr" in warned[0]
