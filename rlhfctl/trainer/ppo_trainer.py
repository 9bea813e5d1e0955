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

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rlhfctl.algorithms import apply_kl_penalty, build_kl_controller, compute_advantages
from rlhfctl.models.loading import load_tokenizer
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller.futures import GroupFuture, PendingUnion, union_pending
from rlhfctl.trainer import checkpoint
from rlhfctl.trainer.balance import balanced_order, shard_token_totals
from rlhfctl.trainer.metrics import MetricsLog, batch_metrics, first_non_finite, mean_over_ranks
from rlhfctl.trainer.prompt_source import build_dataset, make_batcher, to_dataproto
from rlhfctl.trainer.role_groups import RoleGroups, build_role_groups
from rlhfctl.trainer.runtime import TrainerRuntime
from rlhfctl.trainer.samples import SampleLog


class TrainingDiverged(RuntimeError):
    """A loss or reward became NaN or infinite; the last good checkpoint is kept."""


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


class PPOTrainer(TrainerRuntime):
    """Drives the role worker groups through PPO-family training steps."""

    def __init__(self, cfg: DictConfig, reporter: Any, groups: RoleGroups | None = None) -> None:
        self.cfg = cfg
        self.reporter = reporter
        self.output_dir = Path(cfg.trainer.output_dir)
        for module in cfg.algorithm.import_modules or []:
            importlib.import_module(module)  # custom advantage estimators register themselves on import
        self.tokenizer = load_tokenizer(OmegaConf.to_container(cfg.roles.actor.model, resolve=True),
                                        trust_remote_code=bool(cfg.roles.actor.model.trust_remote_code))
        self.train_data = build_dataset(cfg, self.tokenizer, "train")
        if self.train_data is None:
            raise ValueError("data: set data.train_files or data.task so there are prompts to train on")
        self.val_data = build_dataset(cfg, self.tokenizer, "val") if cfg.trainer.val_every else None
        self.batcher = make_batcher(self.train_data, cfg)
        kl = cfg.algorithm.kl
        self.kl_controller = build_kl_controller(kl.controller, kl.coef, kl.target, kl.horizon)
        self.groups = groups or build_role_groups(cfg, call_timeout_s=cfg.trainer.call_timeout_s)
        self.actor = self.groups["actor"]
        self.reward = self.groups["reward"]
        self.critic = self.groups.get("critic")
        lora_reference = cfg.roles.actor.lora is not None and self.groups.get("reference") is None
        self.reference = self.actor if lora_reference else self.groups.get("reference")
        self._next_rollout: tuple[DataProto, GroupFuture, dict[str, GroupFuture]] | None = None
        self.samples = SampleLog(self.output_dir, cfg.trainer.log_samples, self.tokenizer)
        self._start_runtime()

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Run from ``start_step`` to ``trainer.total_steps``; returns the last step's metrics."""
        cfg, total = self.cfg.trainer, self.cfg.trainer.total_steps
        metrics: dict[str, float] = {}
        for step in range(self.start_step + 1, total + 1):
            self.reporter.step_started(step, total)
            step_start = time.time()
            metrics = self.train_step(step)
            self.record_step_trace(step, step_start, time.time())
            if cfg.val_every and (step % cfg.val_every == 0 or step == total):
                metrics.update(self.validate())
            self.metrics_log.write(step, metrics)  # every trainer.loggers entry, the console's line included
            self.samples.write(step, self.metrics_log)
            self.completed_step = step
            if cfg.save_every and (step % cfg.save_every == 0 or step == total):
                self.save(step)
        return metrics

    def train_step(self, step: int) -> dict[str, float]:
        """One PPO-family step over ``trainer.batch_size`` prompts."""
        timer = PhaseTimer()
        step_start = time.perf_counter()
        prompts, rollout, scoring = self._next_rollout or self._start_rollout()
        self._next_rollout = None
        with timer("generate"):
            batch = rollout.get()
        with timer("reward_ref_values"):
            batch, pending = self._collect_scores(batch, scoring)
        if self._needs_old_log_probs():
            with timer("old_log_prob"):
                batch = batch.union(self.actor.compute_log_prob(batch))
        with timer("advantages"):
            batch = self._advantages(batch, prompts)
        metrics: dict[str, float] = {}
        if self.cfg.trainer.balance_batch:
            batch = self._balanced(batch, metrics)
        if self.critic is not None:
            with timer("update_critic"):
                metrics.update(mean_over_ranks(self.critic.update_critic(batch)))
        update = None
        if step > self.cfg.trainer.critic_warmup_steps:
            update = self.actor.submit("update_actor", union_pending(batch, *pending))
        if self._may_start_next_rollout(step):
            self._next_rollout = self._start_rollout()  # queued behind the update on the actor's ranks
        if update is not None:
            with timer("update_actor"):
                metrics.update(mean_over_ranks(update.get()))
        # The driver's copy of the pending columns, for the metrics: fetched once the update is done, so
        # the driver is not busy when the reference pass hands over to the update on a shared machine.
        batch = self._join(batch, pending)
        metrics.update(batch_metrics(batch))
        metrics.update(self._kl_metrics())
        self.samples.take(batch)  # trainer.log_samples: written with the step's metrics
        metrics.update(timer.metrics())
        metrics["time/step"] = time.perf_counter() - step_start
        tokens = batch.batch["attention_mask"].sum().item()
        metrics["perf/tokens_per_s"] = tokens / metrics["time/step"]
        self._check_finite(step, metrics)
        return metrics

    # ------------------------------------------------------------------ phases
    def _start_rollout(self) -> tuple[DataProto, GroupFuture, dict[str, GroupFuture]]:
        """Draw the next prompts, send them to the actor, and queue the scoring calls behind generation."""
        self._batcher_state_before_draw = self.batcher.state_dict()
        prompts = to_dataproto(next(self.batcher), self.tokenizer)
        rollout = self.actor.submit("generate_sequences", prompts)
        return prompts, rollout, self._submit_scoring(rollout)

    def _may_start_next_rollout(self, step: int) -> bool:
        """Whether to send the next step's rollout before this step ends (``trainer.overlap_rollout``).

        A rank runs the calls it is sent in order, so generation starts on the weights this step's
        update leaves, exactly as if it were sent after the update returned; the driver's end-of-step
        work then overlaps generation. Not after steps that save or validate (those calls must come
        first), nor at the last step, nor on the local backend (its calls run as they are sent).
        """
        cfg = self.cfg.trainer
        if not cfg.overlap_rollout or self.actor.backend != "ray" or step >= cfg.total_steps:
            return False
        return not (cfg.save_every and step % cfg.save_every == 0) and not (cfg.val_every and step % cfg.val_every == 0)

    def batcher_state(self) -> dict[str, Any]:
        """The prompt order as of the last completed step, even when the next step's prompts are drawn."""
        if self._next_rollout is not None:
            return self._batcher_state_before_draw
        return self.batcher.state_dict()

    def _submit_scoring(self, rollout: GroupFuture) -> dict[str, GroupFuture]:
        """Reward, values and reference log-probs: independent calls, in flight together.

        They are submitted before the rollout is back: a group with the actor's world size is fed the
        rollout future itself, so each rank starts from its own shard as soon as generation ends,
        without a round trip through the driver. Other groups get the rollout fetched by the driver.
        The reference goes last: colocated roles run in submission order, and the advantages need
        only the reward and the values. A reward in the driver (``pool: driver``) is scored when the
        driver first needs it: a call there runs when it is made, and would wait for the rollout.
        """
        calls = {"reward": (self.reward, "compute_rewards"), "values": (self.critic, "compute_values"),
                 "ref_log_prob": (self.reference, "compute_ref_log_prob")}
        return {name: (_CallWhenNeeded(group, method, rollout) if self._runs_in_driver(group)
                       else group.submit(method, self._rollout_for(group, rollout)))
                for name, (group, method) in calls.items() if group is not None}

    def _runs_in_driver(self, group: Any) -> bool:
        """A group of the driver process (``pool: driver``) in a run whose actor has worker processes."""
        return group.backend == "local" and self.actor.backend != "local"

    def _rollout_for(self, group: Any, rollout: GroupFuture) -> GroupFuture | DataProto:
        """The rollout future where ``group`` can take its shards straight from the actor's ranks."""
        if group.world_size == self.actor.world_size:
            return rollout
        return rollout.get()

    def _collect_scores(self, batch: DataProto, scoring: dict[str, GroupFuture]) -> tuple[DataProto, list[GroupFuture]]:
        """Join what the driver needs now; the reference log-probs stay pending when only the actor needs them.

        Pending, they join the batch on the actor's ranks during ``update_actor`` (see ``union_pending``),
        so the update is sent while the reference pass still runs. The KL penalty in the reward and
        batch balancing read them on the driver first.
        """
        pending = dict(scoring)
        ref = pending.pop("ref_log_prob", None)
        batch = self._join(batch, list(pending.values()))
        if ref is None:
            return batch, []
        if self.cfg.algorithm.kl.use_in_reward or self.cfg.trainer.balance_batch:
            return batch.union(ref.get()), []
        return batch, [ref]

    @staticmethod
    def _join(batch: DataProto, futures: list[GroupFuture]) -> DataProto:
        """The batch with the futures' results joined in, on the driver."""
        return PendingUnion(batch, tuple(futures)).get()

    def _needs_old_log_probs(self) -> bool:
        """A separate old-log-prob pass is redundant for a single on-policy epoch over one mini-batch."""
        cfg = self.cfg
        epochs = cfg.roles.actor.ppo_epochs or cfg.trainer.ppo_epochs
        mini = cfg.roles.actor.mini_batch_size or cfg.trainer.mini_batch_size
        return epochs > 1 or mini < cfg.trainer.batch_size or cfg.algorithm.kl.use_in_reward

    def _advantages(self, batch: DataProto, prompts: DataProto) -> DataProto:
        """KL-shaped rewards and advantages, computed on the driver with pure tensor functions."""
        algo, kl = self.cfg.algorithm, self.cfg.algorithm.kl
        mask = batch.batch["response_mask"]
        rewards = batch.batch["token_level_scores"]
        tensors: dict[str, Any] = {}
        if kl.use_in_reward:
            rewards, current_kl = apply_kl_penalty(rewards, batch.batch["old_log_probs"], batch.batch["ref_log_prob"],
                                                   mask, self.kl_controller.value, kl.kind)
            self.kl_controller.update(float(current_kl), n_steps=len(prompts))
            tensors["token_level_rewards"] = rewards
        baselines = self._remax_baselines(prompts) if algo.adv_estimator == "remax" else None
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
        )
        tensors.update(advantages=advantages, returns=returns)
        return batch.union(DataProto.from_dict(tensors=tensors))

    def _kl_metrics(self) -> dict[str, float]:
        """``kl/coef``: the coefficient of the in-reward KL penalty for the next step (adaptive controllers move it)."""
        return {"kl/coef": float(self.kl_controller.value)} if self.cfg.algorithm.kl.use_in_reward else {}

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
        greedy = self.actor.generate_sequences(greedy_prompts)
        scores = self.reward.compute_rewards(greedy).batch["token_level_scores"].sum(-1)
        return scores.repeat_interleave(self.cfg.rollout.n)

    def validate(self) -> dict[str, float]:
        """Greedy responses to the held-out prompts, scored by the reward role."""
        rows = list(self.val_data)
        scores = []
        for start in range(0, len(rows), self.cfg.trainer.batch_size):
            prompts = to_dataproto(rows[start:start + self.cfg.trainer.batch_size], self.tokenizer)
            prompts.meta_info.update(do_sample=False, n=1)
            scored = self.reward.compute_rewards(self.actor.generate_sequences(prompts))
            scores.append(scored.batch["token_level_scores"].sum(-1))
        values = np.concatenate([s.numpy() for s in scores])
        return {"val/reward/mean": float(values.mean()), "val/samples": float(len(values))}

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
        """The KL controller's coefficient (adaptive controllers change it)."""
        return {"kl_controller": self.kl_controller.state_dict()}

    def restore_driver_state(self, state: dict[str, Any]) -> None:
        self.kl_controller.load_state_dict(state["kl_controller"])


class _CallWhenNeeded:
    """A scoring call on a group in the driver process, made at the first ``get()`` with the collected rollout."""

    def __init__(self, group: Any, method: str, rollout: GroupFuture) -> None:
        self.group, self.method, self.rollout = group, method, rollout
        self._result: Any = None
        self._done = False

    def get(self) -> Any:
        if not self._done:
            self._result = self.group.submit(self.method, self.rollout.get()).get()
            self._done = True
        return self._result


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
