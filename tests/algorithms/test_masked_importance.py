"""Masked importance sampling (rollout.importance_mask) against its formula written out by hand, its share of masked
tokens, and the actor's policy loss with it: the masked tokens leave the loss's sum.

Token-level MIS of Liu, Li et al. 2025 ("When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch"): rho_t = pi_old / pi_engine; a token with rho_t outside [low, high] gets weight 0,
the others weight 1 (times min(rho_t, C) when rollout.importance_cap is set too). The references below use plain
tensor arithmetic, no function of rlhfctl.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlhfctl.algorithms import get_policy_loss, importance_token_weights, masked_importance_weights
from rlhfctl.algorithms.losses import importance_weight_stats

BANDS = [(0.5, 2.0), (0.8, 1.25), (0.0, 1.0), (1.0, 3.0)]


def random_case(seed: int, rows: int = 6, width: int = 9):
    """Old and engine log-probs whose ratios spread over about 0.2 .. 5, current log-probs, advantages, a mask."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3
    engine = old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.6
    cur = old + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(rows, width, generator=g, dtype=torch.float64)
    return old, engine, cur, adv, mask


def hand_mask(old, engine, low, high):
    rho = torch.exp(old - engine)
    return ((rho >= low) & (rho <= high)).to(old.dtype)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("band", BANDS)
def test_masked_importance_weights_are_1_inside_the_band_and_0_outside(seed, band):
    old, engine, *_ = random_case(seed)
    weights = masked_importance_weights(old, engine, *band)
    expected = hand_mask(old, engine, *band)
    assert torch.equal(weights, expected)
    assert not weights.requires_grad and weights.dtype == old.dtype
    assert 0 < expected.sum() < expected.numel()  # each case masks some tokens and keeps some


def test_the_band_is_inclusive_and_a_ratio_of_exactly_1_is_kept():
    old = torch.log(torch.tensor([[0.5, 1.0, 2.0, 0.4999, 2.0001]], dtype=torch.float64))
    engine = torch.zeros_like(old)
    assert masked_importance_weights(old, engine, 0.5, 2.0).tolist() == [[1.0, 1.0, 1.0, 0.0, 0.0]]


@pytest.mark.parametrize("band", [(2.0, 0.5), (1.0, 1.0), (-0.1, 2.0)])
def test_a_band_out_of_order_or_below_0_is_refused(band):
    old = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="0 <= low < high"):
        masked_importance_weights(old, old, *band)


@pytest.mark.parametrize("seed", [3, 4])
def test_with_a_cap_too_the_kept_tokens_are_truncated_and_the_others_0(seed):
    old, engine, *_ = random_case(seed)
    rho = torch.exp(old - engine)
    weights = importance_token_weights(old, engine, cap=1.5, band=(0.5, 2.0))
    assert torch.allclose(weights, torch.clamp(rho, max=1.5) * hand_mask(old, engine, 0.5, 2.0), rtol=0, atol=1e-12)
    assert torch.equal(importance_token_weights(old, engine, band=(0.5, 2.0)), hand_mask(old, engine, 0.5, 2.0))
    assert torch.allclose(importance_token_weights(old, engine, cap=1.5), torch.clamp(rho, max=1.5), atol=1e-12)
    assert importance_token_weights(old, engine) is None


@pytest.mark.parametrize("seed", [5, 6])
@pytest.mark.parametrize("band", BANDS)
def test_the_masked_fraction_is_the_share_of_valid_tokens_outside_the_band(seed, band):
    old, engine, _, _, mask = random_case(seed)
    rho = torch.exp(old - engine)
    outside = ((rho < band[0]) | (rho > band[1])).to(old.dtype)
    stats = importance_weight_stats(old, engine, mask, 2.0, band)
    assert stats["behav_imp_weight/masked_fraction"].item() == pytest.approx(((outside * mask).sum() / mask.sum()).item(), abs=1e-12)
    assert stats["behav_imp_weight/capped_fraction"].item() == pytest.approx(
        (((rho > 2.0).to(old.dtype) * mask).sum() / mask.sum()).item(), abs=1e-12)
    assert "behav_imp_weight/masked_fraction" not in importance_weight_stats(old, engine, mask, 2.0)
    empty = importance_weight_stats(old, engine, torch.zeros_like(mask), None, band)
    assert empty["behav_imp_weight/masked_fraction"].item() == 0.0


# ------------------------------------------------------------------ the actor's _policy_loss applies it


def _actor(monkeypatch, rollout: dict, log_probs: torch.Tensor, agg: str = "token-mean", policy_loss: str = "vanilla"):
    """The actor's _policy_loss on a stand-in worker, with the model's log-probs replaced by ``log_probs`` (as the
    importance_cap actor test in tests/algorithms/test_decoupled_ppo.py)."""
    from workers import actor

    monkeypatch.setattr(actor, "sequence_log_probs", lambda *a, **k: (log_probs, torch.zeros_like(log_probs)))
    config = {"entropy_coeff": 0.0, "loss_agg_mode": agg, "policy_loss": policy_loss, "loss_scale_factor": 9,
              "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0, "behav_imp_weight_cap": None}
    worker = SimpleNamespace(config=config, rollout={"importance_cap": None, "max_new_tokens": 9, **rollout},
                             model=None, kl={})
    return lambda micro: actor.ActorWorker._policy_loss(worker, micro, on_policy=False, use_kl=False, temperature=1.0,
                                                        padding_free=False)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", [7, 8])
def test_the_actors_loss_with_masked_is_is_the_loss_with_the_masked_tokens_removed_from_its_sum(monkeypatch, agg, seed):
    old, engine, cur, adv, mask = random_case(seed)
    band = (0.5, 2.0)
    keep = hand_mask(old, engine, *band)
    assert 0 < (keep * mask).sum() < mask.sum()
    micro = {"old_log_probs": old, "rollout_log_probs": engine, "advantages": adv, "response_mask": mask}
    masked_cur = cur.clone().requires_grad_(True)
    loss, metrics = _actor(monkeypatch, {"importance_mask": list(band)}, masked_cur, agg)(micro)
    loss.backward()
    # Removed: a zero advantage makes a token's clipped surrogate exactly 0, and the denominators stay as they are.
    removed_cur = cur.clone().requires_grad_(True)
    no_engine = {"old_log_probs": old, "advantages": adv * keep, "response_mask": mask}
    removed, _ = _actor(monkeypatch, {}, removed_cur, agg)(no_engine)
    removed.backward()
    assert loss.item() == pytest.approx(removed.item(), abs=1e-12)
    assert torch.allclose(masked_cur.grad, removed_cur.grad, rtol=0, atol=1e-12)
    assert (masked_cur.grad[(keep == 0) & (mask == 1)] == 0).all()
    outside = (1 - keep) * mask
    assert metrics["behav_imp_weight/masked_fraction"].item() == pytest.approx((outside.sum() / mask.sum()).item())
    if agg == "token-mean":  # the formula: the kept tokens' clipped surrogate over all valid tokens
        ratio = torch.exp(cur - old)
        surrogate = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.28))
        surrogate = torch.where(adv < 0, torch.minimum(surrogate, -adv * 3.0), surrogate)
        assert loss.item() == pytest.approx(((surrogate * keep * mask).sum() / mask.sum()).item(), abs=1e-12)


def test_the_actor_truncates_the_kept_tokens_when_the_cap_is_set_too(monkeypatch):
    old, engine, cur, adv, mask = random_case(9)
    micro = {"old_log_probs": old, "rollout_log_probs": engine, "advantages": adv, "response_mask": mask}
    loss, metrics = _actor(monkeypatch, {"importance_cap": 1.5, "importance_mask": [0.5, 2.0]}, cur)(micro)
    weights = torch.clamp(torch.exp(old - engine), max=1.5) * hand_mask(old, engine, 0.5, 2.0)
    config = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0, "loss_scale_factor": 9}
    expected, _ = get_policy_loss("vanilla")(old, cur, adv, mask, "token-mean", config, token_weights=weights)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert {"behav_imp_weight/masked_fraction", "behav_imp_weight/capped_fraction"} <= set(metrics)


def test_the_actor_refuses_masked_is_with_a_loss_that_takes_the_behaviour_log_probs(monkeypatch):
    old, engine, cur, adv, mask = random_case(10)
    micro = {"old_log_probs": old, "rollout_log_probs": engine, "advantages": adv, "response_mask": mask}
    with pytest.raises(ValueError, match="remove rollout.importance_mask"):
        _actor(monkeypatch, {"importance_mask": [0.5, 2.0]}, cur, policy_loss="decoupled_ppo")(micro)


def test_without_engine_log_probs_the_mask_changes_nothing(monkeypatch):
    old, _, cur, adv, mask = random_case(11)
    micro = {"old_log_probs": old, "advantages": adv, "response_mask": mask}
    masked, metrics = _actor(monkeypatch, {"importance_mask": [1.5, 2.0]}, cur)(micro)
    plain, _ = _actor(monkeypatch, {}, cur)(micro)
    assert masked.item() == plain.item() and "behav_imp_weight/masked_fraction" not in metrics


# ------------------------------------------------------------------ a short run


@pytest.mark.slow
def test_a_two_step_run_with_a_band_that_excludes_1_masks_every_token(ray_session, tmp_path):
    """A rollout group of its own returns the behaviour log-probs; at staleness 0 every ratio is about 1, so the
    band [1.5, 2.0] masks every token: the policy loss is 0 and the masked share 1."""
    from tests.trainer.test_training_runs import train

    records = train("quickstart.yaml", tmp_path, "resource_pools.gen={process_on_nodes: [1], use_gpu: false}",
                    "rollout.placement=separate", "rollout.pool=gen", "rollout.importance_mask=[1.5,2.0]",
                    "rollout.n=2", "rollout.max_new_tokens=8", "trainer.batch_size=4", "trainer.mini_batch_size=4",
                    "trainer.total_steps=2", "data.num_train=16", "trainer.log_samples=0")
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["actor/behav_imp_weight/masked_fraction"] == 1.0
        assert record["actor/pg_loss"] == 0.0
        assert record["actor/behav_imp_weight/mean"] == pytest.approx(1.0, abs=1e-4)
