"""Actor and critic on separate pools update at once, and the numbers are those of updating them in turn."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.resolved import resolve
import rlhfctl.trainer.run as run_module
from rlhfctl.trainer import run_training

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
# ppo-gae.yaml: the actor (and reference) on pool "policy", the critic (and reward) on pool "value".
TINY_GAE = ["trainer.total_steps=2", "trainer.batch_size=2", "trainer.mini_batch_size=1", "rollout.n=2",
            "rollout.max_new_tokens=4", "data.num_train=8", "roles.actor.micro_batch_size=null", "trainer.trace=true"]


def train(tmp_path: Path) -> tuple[list[dict], list[dict]]:
    cfg = load_recipe(RECIPES / "ppo-gae.yaml", [f"trainer.output_dir={tmp_path}", *TINY_GAE])
    run_training(cfg)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = [e for e in events if e.get("cat") == "worker" and e["name"] in ("actor.update_actor", "critic.update_critic")]
    return records, spans


def overlapping_steps(spans: list[dict]) -> int:
    """How many (update_actor, update_critic) pairs of worker spans overlap in time."""
    actor = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] == "actor.update_actor"]
    critic = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["name"] == "critic.update_critic"]
    return sum(1 for a in actor for c in critic if a[0] < c[1] and c[0] < a[1])


@pytest.mark.slow
def test_updates_on_separate_pools_overlap_and_give_the_sequential_numbers(ray_session, tmp_path, monkeypatch):
    cfg = load_recipe(RECIPES / "ppo-gae.yaml", TINY_GAE)
    assert resolve(cfg).step.parallel_updates
    assert not resolve(load_recipe(RECIPES / "ppo-gae.yaml", [*TINY_GAE, "roles.critic.pool=policy"])).step.parallel_updates

    together, together_spans = train(tmp_path / "together")
    def in_turn_recipe(cfg):
        recipe = resolve(cfg)
        return dataclasses.replace(recipe, step=dataclasses.replace(recipe.step, parallel_updates=False))

    monkeypatch.setattr(run_module, "resolve", in_turn_recipe)  # the run resolves once and hands it to the trainer
    in_turn, in_turn_spans = train(tmp_path / "in_turn")

    assert {e["pid"] for e in together_spans if e["name"] == "actor.update_actor"}.isdisjoint(
        {e["pid"] for e in together_spans if e["name"] == "critic.update_critic"})
    assert overlapping_steps(together_spans) >= 1
    assert overlapping_steps(in_turn_spans) == 0
    for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "values/mean"):
        assert [r[key] for r in together] == [r[key] for r in in_turn], key
