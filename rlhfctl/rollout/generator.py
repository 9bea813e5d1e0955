"""Generator: one worker's generation, shared by the colocated actor and the rollout group's workers.

It owns what both write alike: the engine choice (the hf decoding loop, or a vLLM engine started here from the
worker's model), the sampling parameters of a call, the agent rollout of ``rollout.multi_turn``, and the seeding
of one generation call (the driver's ``draw``, or a stream's call counter). The worker hands it the model,
tokenizer, device and recipe sections it reads; nothing here imports the workers.

The two places differ in a few settled ways, which ``colocated`` selects:

- colocated (the actor, training on the same device): the vLLM engine follows the trained module: it sleeps
  between rollouts, syncs from the module when its weights are stale and is probed against the actor's own
  log-probs (``probe_gap``) after its first sync and first wake; hf decoding runs inside the training engine's
  ``serving`` context and its samples carry no ``rollout_log_probs``, unless ``rollout.dtype`` sets a precision
  apart from the actor's: then it samples from a :class:`~rlhfctl.rollout.precision_replica.PrecisionReplica` in
  that dtype and returns the decoding loop's ``rollout_log_probs`` (so does a partial rollout's segment); a call
  without a draw takes the next number of its stream's counter.
- on a pool of its own (the rollout group): the engine takes its weights over the weight channel and never
  sleeps; hf samples carry the decoding loop's ``rollout_log_probs``; a call without a draw is draw 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from rlhfctl.agents.trajectory import response_width
from rlhfctl.engine.seeding import derive_seed, generation_seed_parts, make_generator
from rlhfctl.protocol import DataProto
from rlhfctl.rollout import vllm_engine
from rlhfctl.rollout.agent_rollout import AgentRollout, agent_rollout_for, hf_batch_generate
from rlhfctl.rollout.partial_buffer import ENDED
from rlhfctl.rollout.precision_replica import PrecisionReplica
from rlhfctl.rollout.generation import SamplingParams, eos_token_ids, generate_batch, rollout_batch, sample_responses
from rlhfctl.rollout.sync_probe import PROBE_PARAMS, probe_prompts, vocab_of

__all__ = ["Generator", "base_config"]

_PROMPT_KEYS = ("input_ids", "attention_mask")


def base_config(module: nn.Module) -> Any:
    """The transformers config of a plain, DDP, FSDP2 or peft model."""
    inner = getattr(module, "module", module)
    return inner.get_base_model().config if hasattr(inner, "get_base_model") else inner.config


def ends_with(responses: torch.Tensor, response_mask: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """Whether each row's last real token is an EOS: a partial rollout's sample that ended, not one cut by its budget."""
    last = (response_mask.sum(-1).long() - 1).clamp(min=0)
    tokens = responses.gather(1, last.unsqueeze(-1)).squeeze(-1)
    return torch.isin(tokens, torch.tensor(eos_ids, dtype=tokens.dtype)) & (response_mask.sum(-1) > 0)


def _require_keys(data: DataProto, keys: tuple[str, ...], method: str) -> None:
    missing = [key for key in keys if key not in data.batch]
    if missing:
        raise KeyError(f"{method} needs tensors {missing}; the batch has {sorted(data.batch)}")


class Generator:
    """One worker's generation: ``sampling_params``, ``seed_parts`` and ``generate`` for each call.

    Built with the worker (``rollout`` is the recipe's rollout section); :meth:`bind` gives it the model once
    the worker has built it, then :meth:`start_vllm` (with ``rollout.engine: vllm``) and :meth:`start_agent`
    run in the order the worker needs. ``generate_calls`` and ``validate_calls`` are the counters of the
    generate and validate streams (the actor checkpoints them).
    """

    def __init__(self, rollout: Mapping[str, Any], *, role: str, seed: int, rank: int, colocated: bool) -> None:
        self.rollout = rollout
        self.role, self.seed, self.rank = role, int(seed), int(rank)
        self.colocated = bool(colocated)
        self.model: nn.Module | None = None
        self.tokenizer: Any = None
        self.device = torch.device("cpu")
        self.serving: Callable[[], Any] = contextlib.nullcontext
        self.vllm: Any = None  # the vLLM engine with rollout.engine: vllm (rlhfctl/rollout/vllm_engine.py)
        self.agent: AgentRollout | None = None  # the tools and loop of rollout.multi_turn (rlhfctl/rollout/agent_rollout.py)
        self.probe_gap: Callable[[DataProto], tuple[float, int]] | None = None
        self.replica: PrecisionReplica | None = None  # colocated hf in rollout.dtype apart from the actor's
        self.dtype: Any = None
        self.generate_calls = 0
        self.validate_calls = 0

    # ------------------------------------------------------------------ set-up
    def bind(
        self, model: nn.Module, tokenizer: Any, device: torch.device, serving: Callable[[], Any] | None = None
    ) -> None:
        """The model generation runs on (the actor's module, or the rollout group's plain model), its tokenizer and
        device; ``serving`` (a context-manager factory) wraps hf decoding, e.g. to gather FSDP2 shards."""
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.serving = serving or contextlib.nullcontext

    def start_replica(self, model_cfg: Mapping[str, Any], dtype: torch.dtype) -> None:
        """Colocated hf decoding in ``dtype`` (``rollout.dtype`` apart from the actor's): a copy of the bound model's
        architecture in it, which takes the model's weights before the first rollout and after each update."""
        self.replica = PrecisionReplica(model_cfg, self.tokenizer, dtype=dtype, device=self.device, seed=self.seed,
                                        rollout=self.rollout, who=f"{self.role} rank {self.rank}")

    def weights_changed(self) -> None:
        """The bound model took new weights (an update, a checkpoint load): the replica copies them before its next use."""
        if self.replica is not None:
            self.replica.current = False

    def start_agent(self) -> None:
        """The agent rollout of ``rollout.multi_turn.enable`` (None without), with the bound model's EOS ids."""
        self.agent = agent_rollout_for(self.rollout, self.tokenizer, self.model)

    def start_vllm(
        self,
        *,
        prompt_length: int,
        dtype: Any,
        local_rank: int,
        local_world_size: int,
        probe_gap: Callable[[DataProto], tuple[float, int]] | None = None,
    ) -> Any:
        """This rank's vLLM engine (its shard of one, at rollout.vllm.tensor_parallel_size > 1), built from the bound
        model's weights. Colocated, it may sleep (sleep mode as the recipe sets it) and ``probe_gap`` (the actor's
        log-prob gap on a probe's samples) checks its first sync before it serves; on a pool of its own it never
        sleeps."""
        if not vllm_engine.vllm_installed():
            raise vllm_engine.VllmNotInstalled(
                f"rollout.engine: vllm needs vllm in the {self.role} workers: {vllm_engine.VLLM_INSTALL_HINT}")
        settings = vllm_engine.engine_settings(self.rollout)
        if not self.colocated:
            settings = {**settings, "enable_sleep_mode": False}  # its pool trains nothing
        self.dtype, self.probe_gap = dtype, probe_gap
        engine = vllm_engine.VllmRolloutEngine(
            self.model,
            role=self.role,
            rank=self.rank,
            device=self.device,
            seed=derive_seed(self.seed, self.rank, "vllm"),
            settings=settings,
            max_model_len=vllm_engine.context_length(self.model, prompt_length, response_width(self.rollout)),
            dtype=str(dtype),
            local_rank=local_rank,
            local_world_size=local_world_size,
        )
        if self.probe_gap is not None:
            try:
                self.check_first_sync(engine)
            except Exception:
                engine.close()
                raise
        self.vllm = engine
        return engine

    def tensor_parallel_size(self) -> int:
        """``rollout.vllm.tensor_parallel_size``, with the schema's default."""
        return int(vllm_engine.engine_settings(self.rollout)["tensor_parallel_size"])

    def check_first_sync(self, engine: Any, sleep: bool = True) -> None:
        """Score a few fixed prompt tokens' samples with the engine and with the actor right after the first
        sync (and, with sleep mode, after the first wake: see ``probe_due``); a mean |difference| above the
        tolerance means the engine samples from another model than the one trained (a weight the sync missed,
        say), and stops the run with exit 2."""
        engine.probes += 1
        when = "the first weight sync" if engine.probes == 1 else "its first wake from sleep"
        prompts = probe_prompts(vocab_of(self.tokenizer, base_config(self.model)))
        seed = derive_seed(self.seed, self.rank, "vllm-probe", *(() if engine.probes == 1 else (engine.probes,)))
        probe = self._vllm_rollout(prompts, PROBE_PARAMS, seed, engine, sleep=sleep)
        diff, tokens = self.probe_gap(probe)
        tolerance = vllm_engine.probe_tolerance(self.dtype)
        if not diff <= tolerance:  # NaN fails too
            raise vllm_engine.VllmSyncMismatch(
                f"{self.role} rank {self.rank}: after {when} the vLLM engine's log-probs differ from the "
                f"actor's by {diff:.3g} on average (tolerance {tolerance:g}, {tokens} probe tokens) for "
                f"{engine.architecture}: the engine would sample from another model than the one trained. "
                "Use rollout.engine: hf for this model, and report the architecture (docs/rollout.md)"
            )

    def take_spans(self) -> list[tuple[str, float, float]]:
        """Engine phases (wake, sync, generate, sleep) and an agent rollout's rounds and tool calls inside the last
        call, for the dispatch trace."""
        spans = self.vllm.take_spans() if self.vllm is not None else []
        return spans + (self.agent.take_spans() if self.agent is not None else [])

    # ------------------------------------------------------------------ one call
    def sampling_params(self, meta_info: Mapping[str, Any]) -> SamplingParams:
        """The call's sampling parameters: ``rollout``'s, overridden by ``meta_info``."""
        return SamplingParams.from_config(self.rollout, meta_info)

    def seed_parts(self, meta_info: Mapping[str, Any]) -> tuple[Any, ...]:
        """What seeds one generation call: the draw the driver numbered (``meta_info["draw"]``), so a resumed run
        draws the same samples whatever else ran on this rank since its checkpoint; ``meta_info["validate"]`` draws
        from a stream of its own (its own counter), so validation calls leave the training rollouts' random numbers
        unchanged; with ``meta_info["validate_at"]`` (the policy's step and the batch's first prompt) it is keyed by
        that alone, so an evaluation of a checkpoint draws what the run's validation at that step drew. A generate call
        without a draw (ReMax's greedy baseline) takes the next number of the generate counter when colocated, draw 0
        on a pool of its own."""
        stream = "validate" if meta_info.get("validate") else "generate"
        counter = f"{stream}_calls"
        calls = getattr(self, counter)
        setattr(self, counter, calls + 1)
        if stream == "validate" and meta_info.get("validate_at") is not None:
            return (self.seed, self.rank, stream, "at", *(int(part) for part in meta_info["validate_at"]))
        if stream == "generate" and (meta_info.get("draw") is not None or not self.colocated):
            return generation_seed_parts(self.seed, self.rank, meta_info)
        return (self.seed, self.rank, stream, calls)

    def generate(self, prompts: DataProto, params: SamplingParams, parts: tuple[Any, ...]) -> DataProto:
        """``params.n`` samples per left-padded prompt row: agent trajectories with ``rollout.multi_turn``, else
        :meth:`sample`."""
        if self.agent is not None:
            return self._agent_rollout(prompts, params, parts)
        batch = self.sample(prompts, params, parts)
        if prompts.meta_info.get("partial"):  # a partial rollout's segment: did each row end, or run out of budget?
            batch.batch[ENDED] = ends_with(batch.batch["responses"], batch.batch["response_mask"],
                                           eos_token_ids(self.tokenizer, self.model))
        return batch

    def sample(self, prompts: DataProto, params: SamplingParams, parts: tuple[Any, ...]) -> DataProto:
        """One turn's samples on this rank's engine (vLLM's with its ``rollout_log_probs``, else hf decoding)."""
        if self.vllm is not None:
            return self._generate_vllm(prompts, params, derive_seed(*parts))
        if self.colocated and self.replica is None and not prompts.meta_info.get("partial"):
            generator = make_generator(self.device, *parts)
            with self.serving():
                return generate_batch(self.model, self.tokenizer, prompts, params, device=self.device, generator=generator)
        return self._generate_hf_with_log_probs(prompts, params, parts)

    def _hf_sampler(self) -> tuple[nn.Module, Callable[[], Any]]:
        """The model hf decoding runs on and the context around it: the precision replica (its weights brought
        current first), else the bound model in ``serving``."""
        if self.replica is None:
            return self.model, self.serving
        self.replica.refresh(self.model)
        return self.replica.model, contextlib.nullcontext

    def _generate_hf_with_log_probs(self, prompts: DataProto, params: SamplingParams, parts: tuple[Any, ...]) -> DataProto:
        _require_keys(prompts, _PROMPT_KEYS, "generate_sequences")
        eos_ids = eos_token_ids(self.tokenizer, self.model)
        pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos_ids[0])
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        model, serving = self._hf_sampler()
        with serving():
            responses, response_mask, log_probs = sample_responses(
                model, ids.to(self.device), mask.to(self.device), params, eos_ids=eos_ids, pad_id=pad_id,
                generator=make_generator(self.device, *parts), samples_per_prompt=params.n, with_log_probs=True)
        return rollout_batch(prompts, responses.cpu(), response_mask.cpu(), self.tokenizer, params,
                             {"rollout_log_probs": log_probs.cpu()})

    def _agent_rollout(self, prompts: DataProto, params: SamplingParams, parts: tuple[Any, ...]) -> DataProto:
        """Multi-turn trajectories with tool calls (``rollout.multi_turn``), each round on this rank's engine."""
        _require_keys(prompts, _PROMPT_KEYS, "generate_sequences")
        agent = self.agent
        if self.vllm is not None:
            batch_generate = self.vllm.batch_generate(self.model, params, eos_ids=agent.eos_ids, seed=derive_seed(*parts))
            try:
                return agent.generate(prompts, params, batch_generate)
            finally:
                self.vllm.sleep()  # a no-op without sleep mode (the rollout group's engines)
        generator = make_generator(self.device, *parts)
        model, serving = self._hf_sampler()
        batch_generate = hf_batch_generate(
            model, params, eos_ids=agent.eos_ids, pad_id=agent.pad_id, device=self.device, generator=generator
        )
        with serving():
            return agent.generate(prompts, params, batch_generate)

    def _generate_vllm(self, prompts: DataProto, params: SamplingParams, seed: int) -> DataProto:
        """This rank's engine's rollout; colocated, the engine is synced (asleep since the last rollout) and probed
        first when ``probe_due``."""
        _require_keys(prompts, _PROMPT_KEYS, "generate_sequences")
        engine = self.vllm
        if self.probe_gap is not None:
            if not engine.weights_current:
                engine.sync(self.model)  # asleep since the last rollout: wake and load before a probe
            if vllm_engine.probe_due(engine.sleep_mode, engine.wakes, engine.probes):
                self.check_first_sync(engine, sleep=False)  # awake for the rollout that follows
        return self._vllm_rollout(prompts, params, seed, engine)

    def _vllm_rollout(
        self, prompts: DataProto, params: SamplingParams, seed: int, engine: Any, sleep: bool = True
    ) -> DataProto:
        """``engine``'s samples in the hf engine's layout plus ``rollout_log_probs`` (host tensors)."""
        _require_keys(prompts, _PROMPT_KEYS, "generate_sequences")
        eos_ids = eos_token_ids(self.tokenizer, self.model)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos_ids[0]
        responses, response_mask, log_probs = engine.generate(
            self.model,
            prompts.batch["input_ids"],
            prompts.batch["attention_mask"],
            params,
            eos_ids=eos_ids,
            pad_id=int(pad_id),
            seed=seed,
            sleep=sleep,
        )
        return rollout_batch(prompts, responses, response_mask, self.tokenizer, params, {"rollout_log_probs": log_probs})
