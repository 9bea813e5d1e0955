"""RolloutWorker: the rollout group of ``rollout.placement: separate``, generating on a pool of its own.

Each rank holds one engine replica: the hf decoding loop over the actor's model in ``rollout.dtype`` (no
optimizer, no gradients), or a vLLM engine, which then holds the only copy of the weights (the HF model
keeps its config alone once the engine has loaded them). With ``rollout.vllm.tensor_parallel_size`` t > 1
an engine spans t consecutive ranks, each holding one shard: the group joins a torch.distributed world of
its own (vLLM's, as on the actor), so its world is engines x t. It takes the actor's weights through the weight
channel (``receive_weights``) and stamps every sample with the ``policy_version`` of the weights that
generated it, with the engine's own log-probs of the sampled tokens (``rollout_log_probs``, the
behaviour policy of the off-policy corrections). With ``rollout.multi_turn`` each sample is an agent's
trajectory (``rlhfctl.rollout.agent_rollout``): its tools run in the rollout processes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rlhfctl.models.loading import load_causal_lm, load_tokenizer
from rlhfctl.protocol import DataProto
from rlhfctl.recipe.resolve import ROLLOUT_ROLE
from rlhfctl.single_controller import Dispatch, register
from rlhfctl.engine.placement import ONE_TO_ALL_FIRST, EngineSettings, compute_dtype, materialize
from workers.role import RoleWorker
from rlhfctl.rollout.agent_rollout import AgentRollout
from rlhfctl.rollout.generator import Generator
from rlhfctl.rollout.precision_replica import copy_weights
from rlhfctl.rollout.sync_probe import PROBE_PARAMS, probe_prompts, vocab_of
from rlhfctl.engine.seeding import generation_seed_parts
from rlhfctl.rollout.weight_channel import SyncAddress, WeightChannel

__all__ = ["RolloutWorker", "generation_seed_parts"]

_DRAW_KEYS = ("draw", "chunk", "chunks")


class RolloutWorker(RoleWorker):
    """``init_model``, ``join_weight_sync``, ``receive_weights``, ``generate_sequences`` and ``sync_probe``."""

    default_role = ROLLOUT_ROLE

    def __init__(self, recipe: Mapping[str, Any], role: str = ROLLOUT_ROLE) -> None:
        super().__init__(recipe, role)
        self.model_cfg = self.recipe.role("actor").model
        self.rollout = self.recipe.rollout.settings
        self.model: nn.Module | None = None
        # The engine choice, vLLM engine, agent rollout and the seeding of each call (rlhfctl/rollout/generator.py).
        self.generator = Generator(self.rollout, role=self.role, seed=self.seed, rank=self.rank, colocated=False)
        self.channel: WeightChannel | None = None
        self.policy_version = 0

    @property
    def rollout_engine(self) -> Any:
        """The vLLM engine replica with rollout.engine: vllm, else None."""
        return self.generator.vllm

    @property
    def agent_rollout(self) -> AgentRollout | None:
        """The tools and loop of rollout.multi_turn, else None."""
        return self.generator.agent

    @property
    def validate_calls(self) -> int:
        return self.generator.validate_calls

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """The tokenizer and the actor's initial model in ``rollout.dtype`` (null: the actor's compute dtype); with
        ``rollout.engine: vllm`` the engine, loaded from that model, which then keeps only its config."""
        trust = bool(self.model_cfg["trust_remote_code"])
        self.tokenizer = load_tokenizer(self.model_cfg, trust_remote_code=trust)
        compute = compute_dtype(self.recipe.rollout.dtype)
        self.engine = EngineSettings(strategy="ddp", compute_dtype=compute, trainable=False)
        vllm = self.rollout["engine"] == "vllm"
        # An engine over several ranks (vLLM's external launcher) needs the group's torch.distributed world.
        self._setup_process(distributed=vllm and self.generator.tensor_parallel_size() > 1)

        def build(cfg: Mapping[str, Any]) -> nn.Module:
            model = load_causal_lm(cfg, self.tokenizer, dtype=compute, trust_remote_code=trust, seed=self.seed)
            return model.requires_grad_(False)

        # A vLLM engine loads its own copy of the weights, and every sync goes to it: the HF model only hands it the
        # first weights, from the host, so the device is the engine's alone when it measures its free memory at start.
        self.model, _ = materialize(build, self.model_cfg, self.engine, torch.device("cpu") if vllm else self.device)
        self.model.eval()
        self.generator.bind(self.model, self.tokenizer, self.device)
        if vllm:
            # This rank's replica; it never sleeps (its pool trains nothing).
            self.generator.start_vllm(
                prompt_length=int(self.recipe.data.max_prompt_length),
                dtype=self.recipe.rollout.dtype,
                local_rank=self.local_rank,
                local_world_size=self._rank_info.local_world_size,
            )
            self.model.to("meta")  # its config and generation config stay: eos ids, vocabulary, probe prompts
        self.generator.start_agent()

    def take_inner_spans(self) -> list[tuple[str, float, float]]:
        """The vLLM engine's phases (sync, generate) and an agent rollout's rounds and tool calls inside the last call,
        for the dispatch trace."""
        return self.generator.take_spans()

    # ------------------------------------------------------------------ weights
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_weight_sync(self, address: SyncAddress) -> None:
        """Join the actor's weight channel as member ``1 + rank``."""
        timeout = float(self.recipe.trainer.call_timeout_s)
        self.channel = WeightChannel(address, 1 + self.rank, self.device, timeout)

    @register(dispatch_mode=ONE_TO_ALL_FIRST)
    def receive_weights(self, version: int) -> dict[str, float]:
        """Take the weights the actor is sending; the samples generated from now on carry ``version``."""
        if self.channel is None:
            raise RuntimeError(f"{self.role} rank {self.rank}: receive_weights before join_weight_sync")
        start = time.perf_counter()
        if self.rollout_engine is not None:
            self.rollout_engine.load(self.channel.receive())
        else:
            copy_weights(self.model, self.channel.receive(), f"{self.role} rank {self.rank}")
        self.policy_version = int(version)
        end, arrival = time.perf_counter(), self.channel.first_arrival or start
        # The transfer itself, and apart the time spent waiting for the actor to start sending (its update, or at
        # k >= 1 the generation this call queued behind is over before the call starts).
        return {"time/weight_receive": end - arrival, "time/weight_sync_wait": arrival - start}

    # ------------------------------------------------------------------ rollout
    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``rollout.n`` samples per prompt with ``policy_version`` and ``rollout_log_probs``; ``meta_info["draw"]``
        numbers the call (its random stream), ``meta_info["validate"]`` draws from the validation stream."""
        self._require_model()
        params = self.generator.sampling_params(prompts.meta_info)
        parts = self.generator.seed_parts(prompts.meta_info)
        batch = self.generator.generate(prompts, params, parts)
        for key in _DRAW_KEYS:  # the call's own numbering: chunks of one batch are joined later
            batch.meta_info.pop(key, None)
        batch.batch["policy_version"] = torch.full((len(batch),), self.policy_version, dtype=torch.int64)
        return batch

    @register(dispatch_mode=ONE_TO_ALL_FIRST)
    def sync_probe(self) -> DataProto:
        """The fixed probe prompts' samples with this engine's log-probs, for the actor's ``check_weight_sync``."""
        self._require_model()
        prompts = probe_prompts(vocab_of(self.tokenizer, self.model.config))
        return self.generator.sample(prompts, PROBE_PARAMS, (self.seed, self.rank, "sync-probe", self.policy_version))
