"""The PPO-family training loop, read top to bottom like the seed's pseudo-code.

Per step: generate (n per prompt) -> reward -> reference log-probs -> values -> advantages (on the
driver) -> update critic -> update actor -> metrics. Each phase is one call on a worker group.
"""

from __future__ import annotations

import importlib
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from omegaconf import DictConfig

from rlhfctl.algorithms import apply_kl_penalty, build_kl_controller, compute_advantages
from rlhfctl.algorithms.distillation import distillation_advantages, distillation_metrics, reverse_kl
from rlhfctl.data.errors import DataConfigError
from rlhfctl.models.loading import load_tokenizer
from rlhfctl.protocol import DataProto
from rlhfctl.recipe.resolve import ROLLOUT_ROLE, TOKEN_SCORING_ROLES
from rlhfctl.recipe.resolved import resolve
from rlhfctl.recipe.specs import Recipe
from rlhfctl.recipe.stages import MODEL_DIR
from rlhfctl.run_signals import safe_point_pending
from rlhfctl.single_controller.futures import union_pending
from rlhfctl.trainer import checkpoint
from rlhfctl.trainer.balance import balanced_order, shard_token_totals
from rlhfctl.trainer.metrics import MetricsLog, batch_metrics, first_non_finite, mean_over_ranks, without_reward
from rlhfctl.trainer.off_policy_gap import OffPolicyGapWatch
from rlhfctl.trainer.prompt_source import build_dataset, make_batcher
from rlhfctl.trainer.reporting import Reporter
from rlhfctl.rollout.colocated import Rollouts, join
from rlhfctl.trainer.role_groups import RoleGroups, build_role_groups
from rlhfctl.rollout.separate import SeparateRollouts
from rlhfctl.trainer.trainer_base import TrainerBase, TrainingDiverged
from rlhfctl.trainer.sample_metric import named_scores
from rlhfctl.trainer.samples import SampleLog
from rlhfctl.trainer.validation import respond_and_score, scored_validation_metrics

__all__ = ["PPOTrainer", "PhaseTimer", "TrainingDiverged", "summarize"]


class PhaseTimer:
    """Wall-clock seconds per phase of a step, reported as ``time/<phase>``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"time/{phase}": seconds for phase, seconds in self.seconds.items()}


class PPOTrainer(TrainerBase):
    """Drives the role worker groups through PPO-family training steps."""

    def __init__(self, cfg: DictConfig, reporter: Reporter, groups: RoleGroups | None = None,
                 recipe: Recipe | None = None) -> None:
        self.cfg = cfg  # as written: only saved beside the run (recipe.yaml); everything reads self.recipe
        self.reporter = reporter
        self.recipe = recipe = recipe if recipe is not None else resolve(cfg)  # what the trainer and the workers read
        for module in recipe.algorithm.import_modules:
            importlib.import_module(module)  # custom estimators register themselves on import
        self.output_dir = Path(recipe.trainer.output_dir)
        actor_model = recipe.role("actor").model
        self.tokenizer = load_tokenizer(actor_model, trust_remote_code=bool(actor_model.trust_remote_code))
        self.train_data = build_dataset(recipe, self.tokenizer, "train")
        if self.train_data is None:
            raise DataConfigError("data: set data.train_files or data.task so there are prompts to train on")
        self.val_data = build_dataset(recipe, self.tokenizer, "val") if recipe.trainer.val_every else None
        self.batcher = make_batcher(self.train_data, recipe)
        kl = recipe.algorithm.kl
        self.kl_controller = build_kl_controller(kl.controller, kl.coef, kl.target, kl.horizon)
        self.groups = groups or build_role_groups(recipe, call_timeout_s=recipe.trainer.call_timeout_s)
        self.actor = self.groups["actor"]
        self.reward = self.groups.get("reward")  # None: distillation alone, every sample's task reward 0
        self.critic = self.groups.get("critic")
        self.effective = self.recipe.step  # the recipe's fallbacks and derived values (validate shows the same)
        self.reference = {"actor": self.actor, "reference": self.groups.get("reference")}.get(self.effective.reference_source)
        # Frozen roles scoring every sampled token for the advantages (a teacher), sent behind generation.
        self.scorers = [(self.groups[role], method) for role, (method, _) in TOKEN_SCORING_ROLES.items()
                        if self.groups.get(role) is not None]
        # rollout.placement: separate puts generation on a group of its own, up to trainer.max_staleness steps ahead.
        rollout_group = self.groups.get(ROLLOUT_ROLE)
        if rollout_group is not None:
            self.rollouts = SeparateRollouts(
                recipe, self.batcher, self.tokenizer, rollout_group, self.actor, self.reward, self.critic,
                self.reference, restart=lambda: self.groups.restart_rollout(float(recipe.trainer.restart_wait_s)),
                notify=lambda text: self.reporter.message(text, "warning"), scorers=self.scorers)
        else:
            self.rollouts = Rollouts(recipe, self.batcher, self.tokenizer, self.actor, self.reward, self.critic, self.reference,
                                     notify=lambda text: self.reporter.message(text, "warning"), scorers=self.scorers)
        self.samples = SampleLog(self.output_dir, recipe.trainer.log_samples, self.tokenizer)
        self.off_policy_gap = OffPolicyGapWatch()  # warns once when the trained tokens are far off-policy
        self._start_runtime()

    @property
    def generator(self) -> Any:
        """Who samples responses (validation and ReMax's baseline too): the rollout group if there is one (it may have
        been restarted since), else the actor."""
        return self.rollouts.generator

    def setup(self) -> None:
        """Build the models and resume; with a rollout group, open the weight channel and send the first batches."""
        super().setup()
        self.rollouts.start(self.start_step)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Run from ``start_step`` to ``trainer.total_steps``; returns the last step's metrics."""
        trainer, total = self.recipe.trainer, self.recipe.trainer.total_steps
        metrics: dict[str, float] = {}
        for step in range(self.start_step + 1, total + 1):
            with self.step(step):  # a stop signal waits for the step's end: the step is saved whole
                self.reporter.step_started(step, total)
                step_start = time.time()
                metrics = self.train_step(step)
                self.record_step_trace(step, step_start, time.time())
                if trainer.val_every and (step % trainer.val_every == 0 or step == total):
                    metrics.update(self.validate(step))
                with safe_point_pending():  # logged and done as one
                    self.metrics_log.write(step, metrics)  # every trainer.loggers entry, the console's line included
                    self.samples.write(step, self.metrics_log)
                    self.completed_step = step
            if trainer.save_every and (step % trainer.save_every == 0 or step == total):
                self.save(step)
        return metrics

    def train_step(self, step: int) -> dict[str, float]:
        """One PPO-family step over ``trainer.batch_size`` prompts."""
        timer, metrics = PhaseTimer(), {}
        step_start = time.perf_counter()
        rollout = self.rollouts.next()  # sent during the last step with trainer.overlap_rollout
        with timer("generate"):
            batch = rollout.responses()  # with algorithm.filter_groups: the kept groups, rewarded
        metrics.update(rollout.metrics())
        with timer("reward_ref_values"):  # reward, reference and values were sent together, behind generation
            batch, pending_ref = rollout.scored(batch, reference_on_driver=self._reference_on_driver())
        if self.effective.needs_old_log_probs:
            with timer("old_log_prob"):
                batch = batch.union(self.actor.compute_log_prob(batch))
        with timer("advantages"):
            batch = self._advantages(batch, rollout.prompts)
        if self.effective.distillation:
            mask = batch.batch["response_mask"]
            metrics.update(distillation_metrics(batch.batch["reverse_kl"], batch.batch["teacher_log_prob"], mask))
        if self.recipe.trainer.balance_batch:
            batch = self._balanced(batch, metrics)
        metrics.update(self._update_critic_and_actor(step, batch, pending_ref, timer))
        # The driver's copy of the pending columns, for the metrics: fetched once the update is done, so
        # the driver is not busy when the reference pass hands over to the update on a shared machine.
        batch = join(batch, pending_ref)
        metrics.update(batch_metrics(batch) if self.reward is not None else without_reward(batch_metrics(batch)))
        metrics.update(self._kl_metrics())
        self.samples.take(batch)  # trainer.log_samples: written with the step's metrics
        metrics.update(timer.metrics())
        metrics["time/step"] = time.perf_counter() - step_start
        metrics["perf/tokens_per_s"] = batch.batch["attention_mask"].sum().item() / metrics["time/step"]
        self._check_finite(step, metrics)
        if (far := self.off_policy_gap.check(step, metrics)) is not None:
            self.reporter.message(far, "warning")
        return metrics

    # ------------------------------------------------------------------ phases
    def _reference_on_driver(self) -> bool:
        """The in-reward KL and batch balancing read the reference log-probs on the driver."""
        return self.effective.kl_in_reward or bool(self.recipe.trainer.balance_batch)

    def _update_critic_and_actor(self, step: int, batch: DataProto, pending_ref: list[Any],
                                 timer: PhaseTimer) -> dict[str, float]:
        """Update the critic, then the actor (not during ``trainer.critic_warmup_steps``); the next rollout queues behind.

        On separate pools the two updates run at once (both are sent, then both awaited); colocated
        roles share their ranks' processes and run in turn, the critic first.
        """
        metrics: dict[str, float] = {}
        critic = self.critic.update_critic.submit(batch) if self.effective.has_critic else None
        if critic is not None and not self.effective.parallel_updates:
            with timer("update_critic"):
                metrics.update(mean_over_ranks(critic.get()))
            critic = None
        actor = None
        if self.effective.updates_actor(step):
            actor = self.actor.update_actor.submit(union_pending(batch, *pending_ref))
        self.rollouts.send_ahead(step)
        if critic is not None:
            with timer("update_critic"):
                metrics.update(mean_over_ranks(critic.get()))
        if actor is not None:
            with timer("update_actor"):
                metrics.update(mean_over_ranks(actor.get()))
        return metrics

    def batcher_state(self) -> dict[str, Any]:
        """The prompt order as of the last completed step, even when the next step's prompts are drawn."""
        return self.rollouts.batcher_state()

    def _advantages(self, batch: DataProto, prompts: DataProto) -> DataProto:
        """KL-shaped rewards and advantages, computed on the driver with pure tensor functions."""
        algo, kl = self.recipe.algorithm, self.recipe.algorithm.kl
        mask = batch.batch["response_mask"]
        rewards = batch.batch["token_level_scores"]
        tensors: dict[str, Any] = {}
        if self.effective.kl_in_reward:
            rewards, current_kl = apply_kl_penalty(rewards, batch.batch["old_log_probs"], batch.batch["ref_log_prob"],
                                                   mask, self.kl_controller.value, kl.kind)
            self.kl_controller.update(float(current_kl), n_steps=len(prompts))
            tensors["token_level_rewards"] = rewards
        baselines = self._remax_baselines(prompts) if self.effective.greedy_baseline else None
        advantages, returns = compute_advantages(
            algo.adv_estimator,
            token_level_rewards=rewards,
            response_mask=mask,
            values=batch.batch.get("values"),
            index=batch.non_tensor_batch["uid"],
            reward_baselines=baselines,
            gamma=algo.gamma,
            lam=algo.lam,
            norm_by_std=algo.norm_adv_by_std_in_grpo,
            named_scores=named_scores(batch),
            reward_keys=list(algo.gdpo_reward_keys),
            reward_weights=None if algo.gdpo_reward_weights is None else list(algo.gdpo_reward_weights),
        )
        if self.effective.distillation:  # roles.teacher: each token's reverse KL to the teacher enters its advantage
            distill = algo.distillation
            tensors["reverse_kl"] = reverse_kl(batch.batch["old_log_probs"], batch.batch["teacher_log_prob"], mask)
            advantages = distillation_advantages(advantages, tensors["reverse_kl"], mask, distill.coef, distill.mix,
                                                 distill.whiten)
        tensors.update(advantages=advantages, returns=returns)
        return batch.union(DataProto.from_dict(tensors=tensors))

    def _kl_metrics(self) -> dict[str, float]:
        """``kl/coef``: the coefficient of the in-reward KL penalty for the next step (adaptive controllers move it)."""
        return {"kl/coef": float(self.kl_controller.value)} if self.recipe.algorithm.kl.use_in_reward else {}

    def _balanced(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        """Reorder samples so the actor's ranks get similar token counts (trainer.balance_batch)."""
        ranks = self.actor.world_size
        tokens = batch.batch["attention_mask"].sum(-1).numpy()
        order = balanced_order(tokens, ranks)
        balanced = batch[order]
        before, after = shard_token_totals(tokens, ranks), shard_token_totals(tokens[order], ranks)
        metrics["balance/max_over_min_before"] = max(before) / max(min(before), 1)
        metrics["balance/max_over_min_after"] = max(after) / max(min(after), 1)
        return balanced

    def _remax_baselines(self, prompts: DataProto) -> Any:
        """ReMax's baseline: the reward of the greedy response to each prompt, one per sample."""
        greedy_prompts = DataProto(prompts.batch, prompts.non_tensor_batch, {"do_sample": False, "n": 1})
        greedy = self.generator.generate_sequences(greedy_prompts)
        scores = self.reward.compute_rewards(greedy).batch["token_level_scores"].sum(-1)
        return scores.repeat_interleave(self.recipe.rollout.settings.n)

    def validate(self, step: int = 0) -> dict[str, float]:
        """Responses to the held-out prompts, scored by the reward role; per ``data_source`` too.

        One greedy response per prompt, or ``rollout.val_n`` sampled ones, which add ``pass@k`` (the best
        ``acc`` of a prompt's k responses, averaged over prompts). The samples come from the generator's
        validation stream keyed by ``step`` (:mod:`rlhfctl.trainer.validation`): turning validation on leaves the
        training rollouts' random numbers as they were, and ``rlhfctl eval`` of this step's checkpoint draws the same.
        """
        self.rollouts.before_validation(step)  # a rollout group validates the weights step `step` left
        k = int(self.recipe.rollout.settings.val_n)
        batch = respond_and_score(list(self.val_data), self.tokenizer, self.generator, self.reward,
                                  self.recipe.trainer.batch_size, k, step)
        return scored_validation_metrics(batch, k)

    def _check_finite(self, step: int, metrics: dict[str, float]) -> None:
        bad = first_non_finite(metrics, ("reward/mean", "actor/pg_loss", "critic/vf_loss", "actor/grad_norm"))
        if bad is not None:
            phase = bad.split("/")[0]
            raise TrainingDiverged(
                f"step {step}: {bad} is {metrics[bad]} (phase: {phase}); stopping. The last good checkpoint "
                f"in {checkpoint.checkpoint_root(self.output_dir)} is kept; lower the learning rate or check the reward."
            )

    # ------------------------------------------------------------------ checkpoints
    def trainable_groups(self) -> list:
        """Actor and critic hold training state; reference and reward are rebuilt from the recipe."""
        return [group for group in (self.actor, self.critic) if group is not None]

    def driver_state(self) -> dict[str, Any]:
        """The KL controller's coefficient (adaptive controllers change it) and the rollouts' draw count."""
        return {"kl_controller": self.kl_controller.state_dict(), **self.rollouts.driver_state()}

    def restore_driver_state(self, state: dict[str, Any]) -> None:
        self.kl_controller.load_state_dict(state["kl_controller"])
        self.rollouts.restore_driver_state(state)

    def summary(self) -> dict[str, Any]:
        """Mean reward of the first and last steps; with ``trainer.export_hf`` the policy is written to ``<output_dir>/model`` first."""
        summary = summarize(self.metrics_log)
        if self.recipe.trainer.export_hf:
            summary["model_dir"] = str(self.actor.export_hf(str(self.output_dir / MODEL_DIR)))
        return summary


def summarize(metrics_log: MetricsLog, window: int = 5) -> dict[str, Any]:
    """Mean reward over the first and the last steps, for the end-of-run summary.

    The two windows never overlap (``min(window, steps // 2)`` steps each, at least one), and the
    summary names the steps each covers (``reward/first_steps: 1-2``).
    """
    records = metrics_log.read()
    scored = [(r["step"], r["reward/mean"]) for r in records if isinstance(r.get("reward/mean"), (int, float))]
    if not scored:
        return {"steps": len(records)}
    size = max(1, min(window, len(scored) // 2))
    first, last = scored[:size], scored[-size:]
    return {
        "steps": len(records),
        "reward/first_steps": _step_span(first),
        "reward/first_mean": sum(value for _, value in first) / size,
        "reward/last_steps": _step_span(last),
        "reward/last_mean": sum(value for _, value in last) / size,
        "time/step_mean": sum(r.get("time/step", math.nan) for r in records) / len(records),
        "metrics_file": str(metrics_log.path),
    }


def _step_span(window: list[tuple[int, float]]) -> str:
    """``3-4`` (or ``3``): the steps a summary window covers."""
    first, last = window[0][0], window[-1][0]
    return str(first) if first == last else f"{first}-{last}"
