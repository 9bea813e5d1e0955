"""Partial rollouts end to end on a real local Ray, colocated and on a rollout group of its own.

A step's generation gives each sample at most ``rollout.partial.max_tokens_per_step`` tokens; unfinished samples are
carried (in the checkpoint too) and continue in the next step on newer weights. Checked: samples are carried, no
trained token is older than ``trainer.max_staleness``, and a run resumed from a checkpoint holding carried samples
trains what the uninterrupted run trained (colocated: the same numbers, step for step), neither dropping nor
repeating a prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainer.test_separate_rollout_runs import SEPARATE, _prompts
from tests.trainer.test_training_runs import train

PARTIAL = ["trainer.total_steps=4", "trainer.batch_size=4", "trainer.mini_batch_size=4", "rollout.n=2",
           "rollout.max_new_tokens=32", "data.num_train=64", "rollout.partial.max_tokens_per_step=4",
           "rollout.importance_cap=2.0", "trainer.save_every=2", "trainer.log_samples=1000"]
COMPARED = ("reward/mean", "actor/pg_loss", "actor/grad_norm", "rollout/partial/trained_samples",
            "rollout/partial/carried", "rollout/partial/staleness/mean", "rollout/logprob_diff")


def _carried_prompts(checkpoint: Path) -> set[str]:
    from rlhfctl.models.loading import load_tokenizer
    from tests.workers.recipes import TINY_MODEL

    tok = load_tokenizer(TINY_MODEL)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return {tok.decode(group["prompt_ids"], skip_special_tokens=True) for group in state["partial_rollouts"]["groups"]}


@pytest.mark.slow
@pytest.mark.parametrize("placement, bound", [([], 1), (SEPARATE, 2)], ids=["colocated", "separate"])
def test_carried_samples_stay_within_the_staleness_bound_and_survive_a_resume(ray_session, tmp_path, placement, bound):
    placement = [*placement, f"trainer.max_staleness={bound}"]  # the least each placement allows (check_partial)
    straight = train("quickstart.yaml", tmp_path / "straight", *PARTIAL, *placement)
    assert [r["step"] for r in straight] == [1, 2, 3, 4]
    assert all(r["rollout/partial/staleness/max"] <= bound for r in straight)  # every trained token
    assert any(r["rollout/partial/staleness/max"] == bound for r in straight)  # continued samples trained
    assert straight[1]["rollout/partial/carried"] > 0  # the step-2 checkpoint holds unfinished samples
    checkpoint = tmp_path / "straight" / "checkpoints" / "step_2"
    carried = _carried_prompts(checkpoint)
    assert carried

    resumed = train("quickstart.yaml", tmp_path / "resumed", *PARTIAL, *placement, f"trainer.resume={checkpoint}")
    assert [r["step"] for r in resumed] == [3, 4]
    before, after, later = _prompts(tmp_path / "straight"), _prompts(tmp_path / "resumed"), _prompts(tmp_path / "straight")
    trained_before = {prompt for step in (1, 2) for prompt in before[step]}
    trained_after = [prompt for step in (3, 4) for prompt in after[step]]
    assert not trained_before & set(trained_after) and len(trained_after) == len(set(trained_after))  # none repeated
    assert carried & set(trained_after)  # carried groups went on to train after the resume
    if not placement:  # colocated: the resumed steps are the uninterrupted run's, number for number
        assert after == {step: later[step] for step in (3, 4)}
        for key in COMPARED:
            assert [r[key] for r in resumed] == [r[key] for r in straight[2:]], key


def _responses(output_dir: Path) -> dict[int, list[tuple[str, str]]]:
    steps: dict[int, list[tuple[str, str]]] = {}
    for line in (output_dir / "samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(int(record["step"]), []).append((record["prompt"], record["response"]))
    return steps


def test_a_budget_that_carries_nothing_trains_exactly_the_synchronous_step(tmp_path):
    """With ``max_tokens_per_step`` at ``max_new_tokens`` every sample finishes in its step's one segment: the partial
    path (buffer, segment, assembled batch, driver-side scoring) must then train what the synchronous step trains,
    the same samples and the same numbers, so what partial rollouts change is only what they carry."""
    common = ["ray.backend=local", "trainer.total_steps=3", "trainer.batch_size=4", "trainer.mini_batch_size=4",
              "rollout.n=2", "rollout.max_new_tokens=16", "data.num_train=64", "rollout.importance_cap=2.0",
              "trainer.save_every=0", "trainer.log_samples=1000", "trainer.max_staleness=1"]
    sync = train("quickstart.yaml", tmp_path / "sync", *common)
    partial = train("quickstart.yaml", tmp_path / "partial", *common, "rollout.partial.max_tokens_per_step=16")
    assert [r["rollout/partial/carried"] for r in partial] == [0.0, 0.0, 0.0]
    assert [r["rollout/partial/trained_samples"] for r in partial] == [8.0, 8.0, 8.0]
    assert _responses(tmp_path / "partial") == _responses(tmp_path / "sync")  # the same samples, step for step
    for key in ("reward/mean", "response_length/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm",
                "actor/entropy"):
        assert [r[key] for r in partial] == pytest.approx([r[key] for r in sync], rel=1e-5, abs=1e-6), key
