"""ActorWorker: the policy. Samples rollouts, scores its own log-probs and takes PPO steps."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from rlhfctl.algorithms import agg_loss, get_policy_loss, kl_penalty
from rlhfctl.algorithms.losses import importance_token_weights, importance_weight_stats
from rlhfctl.algorithms.masked import masked_mean
from rlhfctl.algorithms.policy_losses import policy_loss_takes_behaviour
from rlhfctl.protocol import DataProto
from rlhfctl.recipe.resolve import samples_per_rank
from rlhfctl.single_controller import Dispatch, register
from rlhfctl.engine.placement import compute_dtype, scoring, serving
from rlhfctl.engine.log_probs import position_ids_from_mask, sequence_log_probs
from rlhfctl.engine.memory import StateObserver
from rlhfctl.engine.micro_batches import loss_token_counts
from rlhfctl.engine.offload import on_device
from rlhfctl.rollout.generator import Generator
from rlhfctl.rollout.sync_probe import log_prob_gap
from workers.policy_model import PolicyModelWorker, ResponseScoring
from rlhfctl.rollout.weight_sender import WeightSender
from rlhfctl.engine.training import allreduce_mean

__all__ = ["ActorWorker"]

_UPDATE_KEYS = ("input_ids", "attention_mask", "responses", "response_mask", "advantages")
_OPTIONAL_KEYS = ("position_ids", "old_log_probs", "ref_log_prob", "rollout_log_probs")


class ActorWorker(ResponseScoring, PolicyModelWorker, WeightSender):
    """The policy role: ``generate_sequences``, ``compute_log_prob``, ``update_actor`` and checkpoints.

    With ``roles.actor.lora`` set, only the adapter trains and ``compute_ref_log_prob`` gives the
    reference log-probs from the same weights with the adapter switched off (no reference role needed).
    """

    default_role = "actor"
    counter_names = ("generate_calls", "update_calls", "validate_calls")

    def __init__(self, recipe: Mapping[str, Any], role: str = "actor") -> None:
        super().__init__(recipe, role)
        self.rollout = self.recipe.rollout.settings
        self.kl = self.recipe.algorithm.kl
        # The engine choice, vLLM engine, agent rollout and the seeding of each call (rlhfctl/rollout/generator.py).
        self.generator = Generator(self.rollout, role=self.role, seed=self.seed, rank=self.rank, colocated=True)

    @property
    def rollout_engine(self) -> Any:
        """The vLLM engine with rollout.engine: vllm (rlhfctl/rollout/vllm_engine.py), else None."""
        return self.generator.vllm

    @property
    def agent_rollout(self) -> Any:
        """The tools and loop of rollout.multi_turn (rlhfctl/rollout/agent_rollout.py), else None."""
        return self.generator.agent

    @property
    def generate_calls(self) -> int:
        return self.generator.generate_calls

    @generate_calls.setter
    def generate_calls(self, value: int) -> None:
        self.generator.generate_calls = value

    @property
    def validate_calls(self) -> int:
        return self.generator.validate_calls

    @validate_calls.setter
    def validate_calls(self, value: int) -> None:
        self.generator.validate_calls = value

    # ------------------------------------------------------------------ set-up
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @on_device
    def init_model(self) -> None:
        """Build tokenizer, model (plus LoRA adapter), placed by ``roles.actor.strategy`` (FSDP2 shards or a
        DDP replica, float32 master weights computing in ``model.dtype``), optimizer and LR scheduler; then the
        agent rollout and, colocated, this rank's engine in ``rollout.dtype``: vLLM's (its first sync probed), or
        with hf in a precision apart from the actor's, the copy of the model it samples from."""
        self._init_trained_model()
        self.generator.bind(self.module, self.tokenizer, self.device, serving=lambda: serving(self.module, self.engine))
        self.generator.start_agent()
        rollout = self.recipe.rollout
        if rollout.on_own_pool:
            return  # the rollout group holds the engines
        if rollout.engine == "vllm":
            self.generator.start_vllm(
                prompt_length=int(self.recipe.data.max_prompt_length),
                dtype=rollout.dtype,
                local_rank=self.local_rank,
                local_world_size=self._rank_info.local_world_size,
                probe_gap=self._probe_gap,
            )
        elif rollout.own_precision:
            self.generator.start_replica(self.model_cfg, compute_dtype(rollout.dtype))

    def _probe_gap(self, probe: DataProto) -> tuple[float, int]:
        """The actor's log-probs of a sync probe's samples against the engine's: mean gap and token count."""
        self.module.eval()
        with scoring(self.module, self.engine):
            actor, _ = self._response_log_probs(probe, with_entropy=False)
        return log_prob_gap(actor, probe)

    def take_inner_spans(self) -> list[tuple[str, float, float]]:
        """Engine phases (wake, sync, generate, sleep) run inside the last call, for the dispatch trace."""
        return self.generator.take_spans()

    # ------------------------------------------------------------------ rollout and scoring
    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample ``rollout.n`` responses per left-padded prompt row (meta_info may override sampling).

        ``meta_info["validate"]`` draws from a separate stream (its own counter), so validation calls
        leave the training rollouts' random numbers unchanged.
        """
        self._require_model()
        params = self.generator.sampling_params(prompts.meta_info)
        parts = self.generator.seed_parts(prompts.meta_info)
        self.module.eval()
        batch = self.generator.generate(prompts, params, parts)
        batch.meta_info.pop("draw", None)  # the call's own numbering
        return batch

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs and entropies of ``responses`` under the current policy: ``old_log_probs``, ``entropys``."""
        self._require_model()
        self._require_keys(data, ("input_ids", "attention_mask", "responses"), "compute_log_prob")
        self.module.eval()
        with scoring(self.module, self.engine):
            log_probs, entropy = self._response_log_probs(data, with_entropy=True)
        return DataProto.from_dict({"old_log_probs": log_probs, "entropys": entropy})

    # ------------------------------------------------------------------ training
    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO epochs over shuffled mini-batches (micro-batched, grad-accumulated, clipped); returns
        rank-averaged metrics ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``,
        ``actor/ppo_kl``, ``actor/entropy``, ``actor/kl_loss`` (with the KL loss), ``actor/grad_norm``, ``actor/lr``,
        and the largest rank's ``memory/actor/state_gib`` (``max_allocated_gib`` too on CUDA).

        Without ``old_log_probs`` the batch is taken as on-policy: the detached log-probs of the
        current weights serve as the old ones. That saves the separate ``compute_log_prob`` pass and
        is exact only when every sample is used once, before any optimizer step (``ppo_epochs == 1``
        and a single mini-batch); any other setting raises instead of silently biasing the update.
        """
        lr = self._start_update(data, _UPDATE_KEYS, "update_actor")
        self._check_staleness(data)
        batch = {key: data.batch[key] for key in _UPDATE_KEYS + _OPTIONAL_KEYS if key in data.batch}
        if "position_ids" not in batch:
            batch["position_ids"] = position_ids_from_mask(batch["attention_mask"])
        rows = len(data)
        epochs = max(1, int(self.config["ppo_epochs"] or 1))
        mini_rows = samples_per_rank(self.config["mini_batch_size"], self.rollout["n"], self.world_size, rows)
        on_policy = "old_log_probs" not in batch
        if on_policy and (epochs > 1 or mini_rows < rows):
            raise ValueError(
                "update_actor got no old_log_probs, which is only valid on-policy (ppo_epochs == 1 and one "
                f"mini-batch); here ppo_epochs={epochs} and mini-batches of {mini_rows} of {rows} rows per rank. "
                "Call compute_log_prob first and add its old_log_probs to the batch."
            )
        use_kl = bool(self.kl["use_kl_loss"])
        if use_kl and "ref_log_prob" not in batch:
            raise KeyError("algorithm.kl.use_kl_loss is on, so update_actor needs tensor 'ref_log_prob'")
        loss_fn = functools.partial(
            self._policy_loss,
            on_policy=on_policy,
            use_kl=use_kl,
            temperature=self._temperature(data),
            padding_free=self.padding_free(self.module),
        )
        observer = StateObserver(self.module, self.optimizer)
        metrics = self._optimize(
            batch, loss_fn, stream="update", epochs=epochs, mini_batch_rows=mini_rows,
            micro_batch_rows=self.config["micro_batch_size"], row_tokens=batch["attention_mask"].sum(-1),
            loss_tokens=loss_token_counts(batch["response_mask"], str(self.config["loss_agg_mode"]),
                                          str(self.config["policy_loss"])),
            after_step=observer,
        )
        named = {f"actor/{key}": value for key, value in metrics.items()}
        if "actor/logprob_diff" in named:
            named["rollout/logprob_diff"] = named.pop("actor/logprob_diff")
        named["actor/lr"] = lr
        self.generator.weights_changed()
        if self.rollout_engine is not None:
            if self.device.type == "cuda":
                self.optimizer.zero_grad(set_to_none=True)  # gradients are not needed until the next update
            self.rollout_engine.sync(self.model)
            named.update(self.rollout_engine.take_metrics())
        return {**allreduce_mean(named, self.device), **observer.metrics(self.role, self.device)}

    def _check_staleness(self, data: DataProto) -> None:
        """Refuse samples more than ``trainer.max_staleness`` policy versions behind this actor's weights.

        ``policy_version`` is stamped by the rollout group (the weight syncs it took); the version of the
        weights here is the updates taken so far. The trainer's schedule keeps the bound; this is its proof.
        """
        versions = data.batch.get("policy_version")
        if versions is None:
            return
        bound = self.recipe.rollout.max_staleness
        lag = self.update_calls - int(versions.min())
        if lag > bound:
            raise RuntimeError(
                f"{self.role} rank {self.rank}: a sample of policy version {int(versions.min())} reached update "
                f"{self.update_calls + 1}, {lag} versions old, past trainer.max_staleness={bound}"
            )

    def _after_load(self) -> None:
        """The engine takes the restored weights before its next rollout."""
        self.generator.weights_changed()
        if self.rollout_engine is not None:
            self.rollout_engine.weights_current = False

    def _policy_loss(
        self, micro: dict[str, torch.Tensor], *, on_policy: bool, use_kl: bool, temperature: float, padding_free: bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        config = self.config
        coeff = float(config["entropy_coeff"] or 0.0)
        agg = str(config["loss_agg_mode"])
        log_probs, entropy = sequence_log_probs(
            self.model,
            micro,
            temperature=temperature,
            with_entropy=True,
            entropy_grad=coeff != 0.0,
            padding_free=padding_free,
        )
        mask = micro["response_mask"]
        old = log_probs.detach() if on_policy else micro["old_log_probs"].to(log_probs.dtype)
        engine_log_probs = micro.get("rollout_log_probs")
        engine = None if engine_log_probs is None else engine_log_probs.to(old.dtype)
        cap, band = self.rollout.get("importance_cap"), self.rollout.get("importance_mask")
        band = None if band is None else (float(band[0]), float(band[1]))
        name = str(config["policy_loss"])
        weights, behaviour, weight_metrics = None, {}, {}
        if policy_loss_takes_behaviour(name):  # e.g. decoupled_ppo: the engine is the behaviour policy (None: the actor itself)
            for key, value in (("importance_cap", cap), ("importance_mask", band)):
                if value is not None:
                    raise ValueError(
                        f"rollout.{key} and roles.actor.policy_loss={name} both weigh each token by pi_old/pi_engine, "
                        f"so it would count twice; remove rollout.{key} (decoupled_ppo caps with "
                        "roles.actor.behav_imp_weight_cap)"
                    )
            behaviour = {"behaviour_log_prob": engine}
        elif engine is not None and (cap is not None or band is not None):  # truncated and/or masked IS
            weights = importance_token_weights(old, engine, cap=cap, band=band)
            weight_metrics = importance_weight_stats(old, engine, mask, None if cap is None else float(cap), band)
        loss_config = dict(config)
        scale = float(config["loss_scale_factor"])  # resolved: null is the response width
        pg_loss, pg_metrics = get_policy_loss(name)(
            old, log_probs, micro["advantages"].to(log_probs.dtype), mask, agg, loss_config, token_weights=weights,
            **behaviour,
        )
        entropy_loss = agg_loss(entropy, mask, agg, scale)
        loss = pg_loss - coeff * entropy_loss
        metrics = {"pg_loss": pg_loss.detach(), **pg_metrics, **weight_metrics, "entropy": entropy_loss.detach()}
        if engine_log_probs is not None:  # the sync's health: the engine and the actor score the same weights
            metrics["logprob_diff"] = masked_mean((old - engine_log_probs.to(old.dtype)).abs(), mask)
        if use_kl:
            kl = kl_penalty(log_probs, micro["ref_log_prob"].to(log_probs.dtype), str(self.kl["loss_kind"]))
            kl_loss = agg_loss(kl, mask, agg, scale)
            loss = loss + float(self.kl["loss_coef"]) * kl_loss
            metrics["kl_loss"] = kl_loss.detach()
        return loss, metrics
