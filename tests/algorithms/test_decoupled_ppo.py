"""decoupled_ppo against the decoupled objective written out by hand, and the importance-weight statistics of it
and of truncated importance sampling (rollout.importance_cap).

The reference below is a transcription of the objective of Hilton et al. 2022 ("Batch size-invariance for policy
optimization", arXiv:2110.00641), as AReaL trains with it (Fu et al. 2025, arXiv:2505.24298), in plain tensor
arithmetic: no function of rlhfctl is used to compute it.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rlhfctl.algorithms import (
    LOSS_AGG_MODES,
    get_policy_loss,
    truncated_importance_weights,
)
from rlhfctl.algorithms.losses import importance_weight_stats
from rlhfctl.algorithms.policy_losses import (
    policy_loss_keys,
    policy_loss_takes_behaviour,
)

SCALE = 7.0  # seq-mean-token-sum-norm's constant in these cases


def paper_loss(behav, prox, cur, adv, mask, eps_low, eps_high, cap, agg):
    """-(pi_prox/pi_behav) * min(r A, clip(r, 1-eps_low, 1+eps_high) A), r = pi_theta/pi_prox; a token whose
    weight is over the cap has weight 0 and still counts in the denominator (AReaL's behav_mask)."""
    weight = torch.exp(prox - behav)
    if cap is not None:
        weight = weight * (weight <= cap)
    r = torch.exp(cur - prox)
    token = -weight * torch.minimum(r * adv, torch.clamp(r, 1 - eps_low, 1 + eps_high) * adv)
    summed = (token * mask).sum(-1)
    if agg == "token-mean":
        return summed.sum() / mask.sum()
    if agg == "seq-mean-token-mean":
        return (summed / mask.sum(-1)).mean()
    if agg == "seq-mean-token-sum":
        return summed.mean()
    return summed.mean() / SCALE  # seq-mean-token-sum-norm


def random_case(seed: int):
    g = torch.Generator().manual_seed(seed)
    rows, width = 6, 9
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    prox = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3
    behav = prox + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.6  # weights about 0.2 .. 5
    cur = prox + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3  # ratios in and out of the clip
    adv = torch.randn(rows, width, generator=g, dtype=torch.float64)
    return behav, prox, cur, adv, mask


def run(behav, prox, cur, adv, mask, agg, **settings):
    config = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0, "loss_scale_factor": SCALE,
              "behav_imp_weight_cap": None, **settings}
    return get_policy_loss("decoupled_ppo")(prox, cur, adv, mask, agg, config, behaviour_log_prob=behav)


CLIPS = [(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]
CAPS = [None, 1.5, 3.0]


def difference_from_the_formula(seed, agg, clip, cap) -> float:
    """max(|loss - formula|, max |d loss/d log_prob - d formula/d log_prob|) on a random case."""
    behav, prox, cur, adv, mask = random_case(seed)
    low, high = clip
    current = cur.clone().requires_grad_(True)
    loss, _ = run(behav, prox, current, adv, mask, agg, clip_ratio_low=low, clip_ratio_high=high,
                  behav_imp_weight_cap=cap)
    (grad,) = torch.autograd.grad(loss, current)
    reference_cur = cur.clone().requires_grad_(True)
    expected = paper_loss(behav, prox, reference_cur, adv, mask, low, high, cap, agg)
    (expected_grad,) = torch.autograd.grad(expected, reference_cur)
    return max(abs(loss.item() - expected.item()), float((grad - expected_grad).abs().max()))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
@pytest.mark.parametrize("clip", CLIPS)
@pytest.mark.parametrize("cap", CAPS)
def test_decoupled_ppo_equals_the_papers_objective_and_its_gradient(seed, agg, clip, cap):
    assert difference_from_the_formula(seed, agg, clip, cap) <= 1e-12
    if cap == 1.5:
        behav, prox, _, _, mask = random_case(seed)
        assert bool((torch.exp(prox - behav)[mask > 0] > cap).any())  # the cap masks some tokens here


def test_the_largest_difference_from_the_formula_over_every_case(capsys):
    largest = max(difference_from_the_formula(seed, agg, clip, cap)
                  for seed in range(3) for agg in LOSS_AGG_MODES for clip in CLIPS for cap in CAPS)
    with capsys.disabled():
        print(f"\nmax |decoupled_ppo - formula| over loss and gradient: {largest:.3e}")
    assert largest <= 1e-12


def test_the_behaviour_weight_is_detached_the_gradient_goes_through_pi_theta_only():
    behav, prox, cur, adv, mask = random_case(3)
    behav, prox, cur = (t.clone().requires_grad_(True) for t in (behav, prox, cur))
    loss, metrics = run(behav, prox, cur, adv, mask, "token-mean", behav_imp_weight_cap=2.0)
    loss.backward()
    assert behav.grad is None and prox.grad is None
    assert cur.grad is not None and bool((cur.grad != 0).any())
    assert all(not value.requires_grad for value in metrics.values())


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_with_behaviour_equal_to_proximal_the_weight_is_1_and_the_loss_is_vanilla_without_dual_clip(agg):
    _, prox, cur, adv, mask = random_case(4)
    settings = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": None, "loss_scale_factor": SCALE}
    vanilla_loss, vanilla_metrics = get_policy_loss("vanilla")(prox, cur, adv, mask, agg, settings)
    for behaviour in (prox.clone(), None):  # None: the hf engine, no rollout_log_probs in the batch
        loss, metrics = get_policy_loss("decoupled_ppo")(prox, cur, adv, mask, agg, settings, behaviour_log_prob=behaviour)
        assert torch.equal(loss, vanilla_loss)
        for key in ("pg_clipfrac", "ppo_kl"):
            assert metrics[key].item() == pytest.approx(vanilla_metrics[key].item(), abs=1e-7), key
        assert [metrics[f"behav_imp_weight/{k}"].item() for k in ("mean", "max", "min", "capped_fraction")] == [1, 1, 1, 0]
    # called as every other loss, without the keyword: the same
    loss, _ = get_policy_loss("decoupled_ppo")(prox, cur, adv, mask, agg, settings)
    assert torch.equal(loss, vanilla_loss)


def test_decoupled_ppo_by_hand():
    # weights pi_prox/pi_behav = [2, 0.5, 1] (pad: 4), cap 1.5 -> [0, 0.5, 1]; ratios [1, 2, 1], A = 1:
    # min(rA, clip(r)A) = [1, 1.28, 1] -> token losses -[0, 0.64, 1], token-mean over all 3 valid: -1.64 / 3
    ln2 = math.log(2.0)
    t = lambda v: torch.tensor([v], dtype=torch.float64)
    prox, behav = t([ln2, 0.0, 0.0, 2 * ln2]), t([0.0, ln2, 0.0, 0.0])
    cur = prox + t([0.0, ln2, 0.0, 0.0])
    mask = t([1.0, 1.0, 1.0, 0.0])
    loss, metrics = run(behav, prox, cur, t([1.0] * 4), mask, "token-mean", behav_imp_weight_cap=1.5)
    assert loss.item() == pytest.approx(-1.64 / 3, abs=1e-12)
    assert metrics["behav_imp_weight/mean"].item() == pytest.approx(3.5 / 3)  # the weights before the cap
    assert metrics["behav_imp_weight/max"].item() == pytest.approx(2.0)  # the pad's 4 is left out
    assert metrics["behav_imp_weight/min"].item() == pytest.approx(0.5)
    assert metrics["behav_imp_weight/capped_fraction"].item() == pytest.approx(1 / 3)
    assert metrics["pg_clipfrac"].item() == pytest.approx(1 / 3)


def test_a_cap_of_1_or_less_is_refused():
    _, prox, cur, adv, mask = random_case(5)
    with pytest.raises(ValueError, match="behav_imp_weight_cap must be > 1"):
        run(prox, prox, cur, adv, mask, "token-mean", behav_imp_weight_cap=1.0)


def test_truncated_importance_sampling_statistics_by_hand():
    # engine log-probs give pi_old/pi_engine = [3, 0.25, 1] (pad: 9); cap 2 truncates the 3 only
    t = lambda v: torch.tensor([v], dtype=torch.float64)
    old = t([math.log(3.0), 0.0, -1.0, math.log(9.0)])
    engine = t([0.0, math.log(4.0), -1.0, 0.0])
    mask = torch.tensor([[1, 1, 1, 0]])
    stats = importance_weight_stats(old, engine, mask, cap=2.0)
    assert set(stats) == {"behav_imp_weight/mean", "behav_imp_weight/max", "behav_imp_weight/min",
                          "behav_imp_weight/capped_fraction"}
    assert stats["behav_imp_weight/mean"].item() == pytest.approx(4.25 / 3)
    assert stats["behav_imp_weight/max"].item() == pytest.approx(3.0)
    assert stats["behav_imp_weight/min"].item() == pytest.approx(0.25)
    assert stats["behav_imp_weight/capped_fraction"].item() == pytest.approx(1 / 3)
    weights = truncated_importance_weights(old, engine, cap=2.0)
    assert ((weights < 2.0 - 1e-12) | (weights == 2.0))[mask > 0].tolist() == [True] * 3
    assert float(((weights == 2.0) & (mask > 0)).sum()) / 3 == pytest.approx(stats["behav_imp_weight/capped_fraction"].item())
    empty = importance_weight_stats(old, engine, torch.zeros(1, 4), cap=2.0)
    assert [value.item() for value in empty.values()] == [0, 0, 0, 0]


def test_the_registry_declares_the_cap_and_the_behaviour_input():
    assert policy_loss_keys("decoupled_ppo") == ("clip_ratio_low", "clip_ratio_high", "behav_imp_weight_cap")
    assert policy_loss_takes_behaviour("decoupled_ppo")
    assert not any(policy_loss_takes_behaviour(name) for name in ("vanilla", "gspo", "cispo", "gpg", "sapo"))


@pytest.mark.parametrize(("overrides", "code", "named"), [
    (["roles.actor.behav_imp_weight_cap=2.0"], 2, "vanilla"),  # the cap with a loss that ignores it
    (["roles.actor.policy_loss=decoupled_ppo", "roles.actor.behav_imp_weight_cap=1.0"], 2, "behav_imp_weight_cap"),
    (["roles.actor.policy_loss=decoupled_ppo", "roles.actor.behav_imp_weight_cap=2.0"], None, None),
])
def test_validate_takes_the_cap_with_decoupled_ppo_only(tmp_path, overrides, code, named):
    from tests.recipe.builders import BASE_RECIPE, validate_cli, write_recipe

    result = validate_cli(write_recipe(tmp_path, BASE_RECIPE), *overrides)
    if code is None:
        assert "behav_imp_weight_cap" not in result.stderr, result.stderr
    else:
        assert result.exit_code == code and "roles.actor.behav_imp_weight_cap" in result.stderr and named in result.stderr


# ------------------------------------------------------------------ the actor's _policy_loss passes them on


def _actor(monkeypatch, policy_loss: str, importance_cap, log_probs: torch.Tensor):
    """The actor's _policy_loss on a stand-in worker, with the model's log-probs replaced by ``log_probs``."""
    # The worker reads its resolved section: loss_scale_factor null is resolved to the response width (9 here).
    from workers import actor

    monkeypatch.setattr(actor, "sequence_log_probs", lambda *a, **k: (log_probs, torch.zeros_like(log_probs)))
    config = {"entropy_coeff": 0.0, "loss_agg_mode": "token-mean", "policy_loss": policy_loss, "loss_scale_factor": 9,
              "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": None, "behav_imp_weight_cap": None}
    worker = SimpleNamespace(config=config, rollout={"importance_cap": importance_cap, "max_new_tokens": 9},
                             model=None, kl={})
    return lambda micro: actor.ActorWorker._policy_loss(worker, micro, on_policy=False, use_kl=False, temperature=1.0,
                                                        padding_free=False)


def test_the_actor_gives_decoupled_ppo_the_engines_log_probs_and_logs_truncated_is_statistics(monkeypatch):
    behav, prox, cur, adv, mask = random_case(6)
    micro = {"old_log_probs": prox, "rollout_log_probs": behav.float(), "advantages": adv, "response_mask": mask}
    loss, metrics = _actor(monkeypatch, "decoupled_ppo", None, cur)(micro)
    expected = paper_loss(behav.float().double(), prox, cur, adv, mask, 0.2, 0.28, None, "token-mean")
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert metrics["behav_imp_weight/max"].item() > 1.5  # the engine's log-probs reached the loss
    without_engine = {key: value for key, value in micro.items() if key != "rollout_log_probs"}
    _, hf_metrics = _actor(monkeypatch, "decoupled_ppo", None, cur)(without_engine)
    assert hf_metrics["behav_imp_weight/mean"].item() == 1.0
    with pytest.raises(ValueError, match="remove rollout.importance_cap"):
        _actor(monkeypatch, "decoupled_ppo", 2.0, cur)(micro)
    _, tis_metrics = _actor(monkeypatch, "vanilla", 2.0, cur)(micro)
    stats = importance_weight_stats(prox, behav.float().double(), mask, 2.0)
    for key, value in stats.items():
        assert tis_metrics[key].item() == pytest.approx(value.item()), key
    _, plain = _actor(monkeypatch, "vanilla", None, cur)(micro)
    assert not any(key.startswith("behav_imp_weight/") for key in plain)


# ------------------------------------------------------------------ a short run


@pytest.mark.slow
def test_a_two_step_decoupled_ppo_run_logs_the_weights_as_1_with_the_hf_engine(ray_session, tmp_path):
    from tests.trainer.test_training_runs import train

    records = train("quickstart.yaml", tmp_path, "roles.actor.policy_loss=decoupled_ppo",
                    "roles.actor.behav_imp_weight_cap=2.0", "rollout.max_new_tokens=8", "trainer.batch_size=4",
                    "trainer.mini_batch_size=4", "trainer.total_steps=2", "data.num_train=16")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["actor/behav_imp_weight/mean"] == pytest.approx(1.0)
        assert record["actor/behav_imp_weight/max"] == pytest.approx(1.0)
        assert record["actor/behav_imp_weight/min"] == pytest.approx(1.0)
        assert record["actor/behav_imp_weight/capped_fraction"] == 0.0
        assert math.isfinite(record["actor/pg_loss"])
