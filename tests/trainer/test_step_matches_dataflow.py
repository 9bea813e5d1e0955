"""The group calls a training run makes are the calls ``training_step(cfg)`` (validate, inspect-dispatch) lists."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rlhfctl.recipe import load_recipe, validate_recipe
from rlhfctl.recipe.dataflow import training_step
from rlhfctl.recipe.resolved import resolve
from rlhfctl.trainer import run_training

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
STEPS = 2
TINY = [f"trainer.total_steps={STEPS}", "trainer.batch_size=2", "trainer.mini_batch_size=2", "rollout.n=2",
        "rollout.max_new_tokens=4", "data.num_train=8", "trainer.trace=true"]
LOCAL = ["ray.backend=local"]


def calls_per_step(output_dir: Path) -> list[Counter]:
    """The group calls of each step, read from the run's trace (the set-up calls before step 1 left out)."""
    events = json.loads((output_dir / "trace.json").read_text())["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "step")
    calls = [e for e in events if e.get("cat") == "call" and e["ts"] >= steps[0][0]]
    after = [c["name"] for c in calls if c["ts"] > steps[-1][1]]
    assert not after, f"group calls after the last step: {after}"
    return [Counter(c["name"] for c in calls if start <= c["ts"] <= end) for start, end in steps]


def planned(cfg) -> Counter:
    """The group calls of one step as ``training_step`` describes them (driver work left out)."""
    return Counter(call.name for call in training_step(resolve(cfg)) if call.role != "driver")


def run(recipe: str, tmp_path: Path, *overrides: str) -> tuple[Counter, list[Counter]]:
    cfg = load_recipe(RECIPES / recipe, [f"trainer.output_dir={tmp_path}", *TINY, *overrides])
    report = validate_recipe(cfg)
    assert not report.errors, report.errors
    run_training(cfg)
    return planned(cfg), calls_per_step(tmp_path)


CASES = {
    "grpo": ("quickstart.yaml", ()),
    "gae_with_a_critic": ("ppo-gae.yaml", ("roles.actor.micro_batch_size=null", "trainer.mini_batch_size=1")),
    "lora_without_a_reference": ("lora-ppo.yaml", ()),
    "remax_greedy_baseline": ("quickstart.yaml", ("algorithm.adv_estimator=remax",)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_step_makes_the_calls_the_dataflow_lists_on_the_local_backend(case, tmp_path):
    recipe, overrides = CASES[case]
    plan, steps = run(recipe, tmp_path, *LOCAL, *overrides)
    assert len(steps) == STEPS
    for step in steps:
        assert step == plan


def test_the_plan_differs_between_the_cases():
    """The comparison above can fail: the four recipes have four different plans."""
    plans = {case: planned(load_recipe(RECIPES / recipe, [*TINY, *overrides])) for case, (recipe, overrides) in CASES.items()}
    assert len({tuple(sorted(plan.items())) for plan in plans.values()}) == len(plans)
    assert plans["lora_without_a_reference"]["actor.compute_ref_log_prob"] == 1
    assert plans["gae_with_a_critic"]["critic.update_critic"] == 1 and plans["gae_with_a_critic"]["actor.compute_log_prob"] == 1
    assert "reference.compute_ref_log_prob" not in plans["lora_without_a_reference"]


def test_a_reward_on_the_driver_with_ray_workers_makes_the_listed_calls(ray_session, tmp_path):
    plan, steps = run("quickstart.yaml", tmp_path, "roles.reward.pool=driver", "trainer.overlap_rollout=false")
    assert plan["reward.compute_rewards"] == 1
    assert steps == [plan] * STEPS


def test_an_overlapped_rollout_sends_the_next_steps_calls_early_and_no_others(ray_session, tmp_path):
    """With trainer.overlap_rollout the next step's rollout and scoring are sent inside this step: same calls in all."""
    plan, steps = run("quickstart.yaml", tmp_path, "trainer.overlap_rollout=true")
    assert sum(steps, Counter()) == Counter({name: count * STEPS for name, count in plan.items()})
    assert steps[0]["actor.generate_sequences"] == 2 and steps[1]["actor.generate_sequences"] == 0
