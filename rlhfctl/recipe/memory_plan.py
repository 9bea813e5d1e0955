"""The memory plan: what each process holds during each call of a step, predicted before launch with no weights loaded.

For every role with a model, the model is built from its config on the meta device (shapes only) to
count its parameters. Then, per rank:

- **state** (every call): trainable roles keep float32 master weights and AdamW's two float32
  moments, frozen roles store ``model.dtype``; ``ddp`` holds a full replica, ``fsdp2`` shards every
  tensor on its first dimension (``ceil(rows / world)`` rows per rank, rank 0 holds the most);
  ``fsdp.cpu_offload`` keeps the sharded state in host memory; ``fsdp.param_offload`` keeps the weights there
  outside the role's own calls, ``fsdp.optimizer_offload`` AdamW's moments outside its update. Gradients exist
  only inside the role's own update: ``zero_grad(set_to_none=True)`` frees them after every optimizer step.
  A LoRA actor's frozen base is in compute dtype, its adapter float32; a MoE model holds every expert.
- **per call**, on top of the state of every role colocated in the process (one process per rank
  hosts all of a pool's roles):

  - ``actor.generate_sequences`` (rollout): on the hf engine, the whole model gathered in compute
    dtype (``rlhfctl.engine.placement.serving``), the KV cache and the prefill's activations; on the vllm
    engine, ``rollout.vllm.gpu_memory_utilization`` x the device (vLLM's budget for its weights, KV
    cache and activations, a per-instance share of the device's total). The share must hold the weights
    of one tensor-parallel shard and one sequence's KV cache (:class:`EngineFit`).
  - log-prob passes (``compute_ref_log_prob``, ``compute_log_prob``, ``compute_values``, a reward
    model's ``compute_rewards``): FSDP2's per-unit unshard (the root unit and two decoder layers), one
    micro-batch's activations (a MoE model's through its active experts) and
    its logits (compute dtype, plus :data:`LOGIT_FP32_COPIES` float32 copies through log-softmax and
    entropy), over one chunk of ``rlhfctl.engine.log_probs.LOGITS_CHUNK_TOKENS`` tokens where the model's
    head scores in chunks (``rlhfctl.engine.forward.SCORED_HEAD_FAMILIES``), else over the whole micro-batch.
  - updates (``update_critic``, ``update_actor``, a stage's ``train_*``): gradients, FSDP2's gathered
    units (the root unit and two decoder layers, the root's unsharded gradients and a float32 copy
    for the reduce-scatter), one micro-batch's activations (layer inputs only under gradient
    checkpointing) and logits.
- **every process**: the CUDA context and NCCL buffers (:data:`CONTEXT_BYTES`); a sleeping vLLM
  engine's residue (:data:`VLLM_ASLEEP_BYTES`) outside the rollout.

With ``rollout.placement: separate`` the rollout worker group (the role ``rollout``, on ``rollout.pool``)
generates instead of the actor, so the engine's terms move to the rollout pool:

- **the rollout pool**: each rank keeps the actor's model in compute dtype as a replica (no optimizer,
  no gradients) with the hf engine; with the vllm engine it keeps no HF weights (they are freed once the
  engine starts) and the engine's share is there in every call, never asleep (the pool trains nothing;
  on CPU its weights + ``cpu_kv_cache_gib``). ``rollout.generate_sequences`` holds the hf engine's KV
  cache, prefill activations and sampling logits for ``ceil(samples_per_step / stream_chunks / world)``
  rows; ``rollout.receive_weights`` holds one received bucket as a byte buffer.
- **the actor's pool**: no ``actor.generate_sequences``, no engine (no KV cache, no awake share, no
  asleep residue); after the update, ``actor.send_weights`` holds the actor's state plus one bucket
  cast (ddp) or gathered (fsdp2: a bucket at a time, never the whole model) in compute dtype, and on
  rank 0 the byte buffer it packs that bucket into.

A sync bucket is ``rollout.vllm.sync_bucket_mib``, or the largest tensor when that is larger (a bucket
holds whole tensors), at most the whole model.

The terms of each call live in :mod:`rlhfctl.recipe.memory_calls`; what cannot fit, and the knobs that would make
it fit, in :mod:`rlhfctl.recipe.memory_misfits`. :meth:`MemoryPlan.phase_bytes` gives
the bytes of each call for one pool's rank; the peak call is what must fit the device. :meth:`MemoryPlan.misfits`
is what cannot (a call above the device, an engine above its share: validate's errors), :meth:`MemoryPlan.tight`
the calls above :data:`TIGHT_SHARE` of it (warnings).
``memory/<role>/state_gib`` measures the state from the live tensors every step (``rlhfctl.engine.memory``).
"""

from __future__ import annotations


import functools
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from rlhfctl.recipe.example_prompt import has_tokenizer_files, local_directory
from rlhfctl.recipe.memory_calls import (
    engine_shape,
    dtype_bytes,
    CONTEXT_BYTES,
    LOGIT_FP32_COPIES,
    VLLM_ASLEEP_BYTES,
    EngineFit,
    Phase,
    PlannedRole,
    Term,
    engine_fit,
    generating_role,
    generation_rows,
    model_shape,
    pool_phases,
    rollout_engine,
    sequence_length,
    stage_of,
)
from rlhfctl.recipe.memory_misfits import TIGHT_SHARE, Misfit, refusals, tight_calls
from rlhfctl.recipe.memory_state import PlannedModel, RankMemory, RoleMemory
from rlhfctl.recipe.resolve import ROLLOUT_ROLE, TOKEN_SCORING_ROLES, resolve_strategy
from rlhfctl.recipe.resolved import DEFAULT_INLINE_MODEL
from rlhfctl.recipe.schema import ModelConfig
from rlhfctl.recipe.specs import Recipe

__all__ = [
    "CONTEXT_BYTES",
    "LOGIT_FP32_COPIES",
    "TIGHT_SHARE",
    "VLLM_ASLEEP_BYTES",
    "EngineFit",
    "MemoryPlan",
    "Misfit",
    "Phase",
    "PlannedModel",
    "RankMemory",
    "RoleMemory",
    "Term",
    "parse_bytes",
    "parse_memory_size",
    "plan_memory",
    "role_strategy",
]

GIB = 2**30
_ADAM_MOMENTS = 2
_MASTER_BYTES = 4  # float32 master weights, gradients and optimizer state
_SIZE_UNITS = {"mb": 10**6, "gb": 10**9, "tb": 10**12, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_memory_size(text: str) -> int:
    """``80`` (GiB), ``80GiB``, ``80GB``, ``81920MiB`` as bytes; ValueError for anything else, zero or negative."""
    cleaned = str(text).strip().lower().replace(" ", "")
    number = cleaned.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = cleaned[len(number):] or "gib"
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if unit not in _SIZE_UNITS or not math.isfinite(value):
        raise ValueError(f"cannot read {text!r} as a memory size; write e.g. 80 (GiB), 80GiB, 40GB or 81920MiB")
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive memory size; write e.g. 80 (GiB) or 80GiB")
    return int(value * _SIZE_UNITS[unit])


parse_bytes = parse_memory_size  # the earlier name


def role_strategy(role_section: Mapping[str, Any], world_size: int) -> str:
    """``roles.<role>.strategy`` as :func:`~rlhfctl.recipe.resolve.resolve_strategy` resolves it."""
    return resolve_strategy(role_section.get("strategy") or None, world_size)


@dataclass
class MemoryPlan:
    """Every role's state, every pool's per-call plan per rank, and the device memory to compare with."""

    roles: list[RoleMemory] = field(default_factory=list)
    device_memory: int | None = None
    device_source: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    phases: dict[str, list[Phase]] = field(default_factory=dict)  # pool -> every call of every rank
    engines: dict[str, EngineFit] = field(default_factory=dict)  # pool -> its vLLM engine against its share (GPU)

    def phase_bytes(self, pool: str, rank: int = 0, *, allocated_only: bool = False) -> dict[str, int]:
        """Predicted device bytes of ``pool``'s process ``rank`` during each call of the step, keyed by the
        call (``"actor.generate_sequences"``, ``"actor.compute_log_prob"``, ``"actor.update_actor"``, ...) in
        step order; :attr:`Phase.group` of each is rollout, log-prob passes, update or weight sync.

        Each value sums the call's terms (:meth:`phase_terms`); a term that needs the device memory counts 0
        while it is unknown. ``allocated_only`` leaves out the CUDA context and NCCL buffers, which
        ``torch.cuda.max_memory_allocated`` does not see: that is the number to set beside it."""
        return {phase.call: phase.total - (phase.context if allocated_only else 0)
                for phase in self.phases.get(pool, []) if phase.rank == rank}

    def phase_terms(self, pool: str, rank: int = 0) -> dict[str, dict[str, int | None]]:
        """Call -> term name -> bytes (None: unknown without the device memory) for ``pool``'s process ``rank``."""
        return {phase.call: {term.name: term.bytes for term in phase.terms}
                for phase in self.phases.get(pool, []) if phase.rank == rank}

    def peak(self, pool: str) -> Phase | None:
        """The call and rank with the most bytes in ``pool`` (the one that must fit the device)."""
        return max(self.phases.get(pool, []), key=lambda phase: phase.total, default=None)

    def process_bytes(self) -> dict[str, int]:
        """Pool -> bytes of its peak call on its largest rank."""
        return {pool: peak.total for pool in self.phases if (peak := self.peak(pool)) is not None}

    def misfits(self) -> list[Misfit]:
        """What cannot fit (an error): each vLLM engine whose weights and one sequence's KV cache exceed its share,
        and each pool's calls that need more than ``device_memory`` (largest rank); with the knobs that help."""
        return refusals(self)

    def tight(self) -> list[Misfit]:
        """Calls between :data:`TIGHT_SHARE` and all of the device (a warning), with the knobs that make room."""
        return tight_calls(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (bytes as integers)."""
        roles = []
        for role in self.roles:
            entry = {key: value for key, value in asdict(role).items() if key != "ranks"}
            entry["ranks"] = [{**asdict(rank), "state_bytes": rank.state_bytes, "device_bytes": rank.device_bytes}
                              for rank in role.ranks]
            roles.append(entry)
        phases = {pool: [{"call": phase.call, "group": phase.group, "rank": phase.rank, "total_bytes": phase.total,
                          "terms": [asdict(term) for term in phase.terms]} for phase in items]
                  for pool, items in self.phases.items()}
        peaks = {pool: {"call": peak.call, "rank": peak.rank, "bytes": peak.total}
                 for pool in self.phases if (peak := self.peak(pool)) is not None}
        return {"roles": roles, "process_bytes": self.process_bytes(), "phases": phases, "peak": peaks,
                "device_memory": self.device_memory, "device_source": self.device_source,
                "misfits": [asdict(misfit) | {"message": misfit.message} for misfit in self.misfits()],
                "tight": [asdict(misfit) | {"message": misfit.message} for misfit in self.tight()],
                "engines": {pool: asdict(engine) | {"needed": engine.needed, "budget": engine.budget, "fits": engine.fits}
                            for pool, engine in self.engines.items()},
                "skipped": dict(self.skipped)}


# ------------------------------------------------------------------ the model's shapes


def _meta_model(kind: str, model_cfg: Mapping[str, Any], lora: Any) -> torch.nn.Module:
    """The role's model with meta tensors: the same loaders the workers use, on inline config fields."""
    from rlhfctl.models import loading  # keeps transformers off the CLI's fast path

    inline = dict(model_cfg)
    if inline.get("path"):  # the config only, from a local directory or the HF cache: validate never downloads
        from transformers import AutoConfig  # heavy: only for a checkpoint's config

        try:
            config = AutoConfig.from_pretrained(os.path.expanduser(str(inline["path"])), local_files_only=True,
                                                trust_remote_code=bool(inline.get("trust_remote_code")))
        except OSError:
            raise LookupError(f"{inline['path']} is neither a local directory nor in the Hugging Face cache, "
                              "and the plan reads only local configs") from None
        tokenizer = _checkpoint_tokenizer(inline, config)
        inline = {**inline, "path": None, "tokenizer_path": None, "config": config.to_dict()}
    else:
        tokenizer = loading.load_tokenizer(inline, trust_remote_code=bool(inline.get("trust_remote_code")))
    build = {"causal": loading.load_causal_lm, "value": loading.load_token_value_model,
             "classifier": loading.load_sequence_classifier}[kind]
    with torch.device("meta"):
        model = build(inline, tokenizer, dtype=None, trust_remote_code=bool(inline.get("trust_remote_code")), seed=0)
        if lora is not None and lora is not False:
            from rlhfctl.engine.lora import apply_lora  # peft and transformers: only for a LoRA actor

            model = apply_lora(model, {} if lora is True else lora, seed=0)
    return model


class VocabularyMismatch(ValueError):
    """A checkpoint's config.json ``vocab_size`` is smaller than its tokenizer: the larger ids have no embedding."""


class _CheckpointVocabulary:
    """Stands in for a tokenizer the plan cannot read here: the checkpoint's own vocabulary size and special ids."""

    def __init__(self, config: Any) -> None:
        self.size = int(getattr(config, "vocab_size", 0) or 0)
        self.pad_token_id = getattr(config, "pad_token_id", None)
        self.eos_token_id = getattr(config, "eos_token_id", None)
        self.bos_token_id = getattr(config, "bos_token_id", None)

    def __len__(self) -> int:
        return self.size


def _checkpoint_tokenizer(model_cfg: Mapping[str, Any], config: Any) -> Any:
    """The tokenizer the run pairs with a checkpoint (``tokenizer_path``, else ``path``) when it is on disk here,
    checked against config.json's ``vocab_size``; else a stand-in with the checkpoint's own vocabulary."""
    field = "tokenizer_path" if model_cfg.get("tokenizer_path") else "path"
    tokenizer = _local_tokenizer(str(model_cfg[field]), bool(model_cfg.get("trust_remote_code")))
    vocab = getattr(config, "vocab_size", None)
    if tokenizer is None or vocab is None:
        return _CheckpointVocabulary(config)
    if int(vocab) < len(tokenizer):
        where = "" if field == "path" else f", from model.tokenizer_path {model_cfg[field]}"
        raise VocabularyMismatch(
            f"{model_cfg['path']}/config.json has vocab_size={vocab}, smaller than the tokenizer ({len(tokenizer)} "
            f"tokens{where}): token ids {vocab}..{len(tokenizer) - 1} have no embedding row; resize the model's "
            "embeddings to the tokenizer (resize_token_embeddings) and save it again, or use its own tokenizer"
        )
    return tokenizer


def _local_tokenizer(source: str, trust_remote_code: bool) -> Any:
    """The tokenizer in ``source`` when it is a local directory or cached hub id (None when not here or unloadable)."""
    directory = local_directory(source)
    if directory is None or not has_tokenizer_files(directory):
        return None  # a config.json alone sizes the model; the example prompt warns about the missing tokenizer
    files = sorted(os.listdir(directory))
    stamp = tuple((name, os.stat(os.path.join(directory, name)).st_mtime_ns) for name in files if "token" in name)
    return _load_tokenizer(directory, trust_remote_code, stamp)


@functools.lru_cache(maxsize=8)
def _load_tokenizer(directory: str, trust_remote_code: bool, stamp: tuple[tuple[str, int], ...]) -> Any:
    """One load per tokenizer directory and version of its files: the plan asks once per role sharing it."""
    from rlhfctl.models import loading  # keeps transformers off the CLI's fast path

    try:
        return loading.load_tokenizer({"path": directory}, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - a tokenizer that does not load is the example prompt's error, not the plan's
        return None


# ------------------------------------------------------------------ each role's state


def _shapes(model: torch.nn.Module, trainable_only: bool) -> list[torch.Size]:
    return [parameter.shape for parameter in model.parameters() if parameter.requires_grad or not trainable_only]


def _per_rank_elements(shapes: list[torch.Size], world: int, rank: int, sharded: bool) -> int:
    """Elements this rank holds: everything, or its dim-0 chunk of each tensor (torch.chunk's split)."""
    if not sharded:
        return sum(math.prod(shape) for shape in shapes)
    total = 0
    for shape in shapes:
        rows = shape[0] if len(shape) else 1
        chunk = math.ceil(rows / world)
        mine = max(0, min(chunk, rows - rank * chunk))
        total += mine * (math.prod(shape[1:]) if len(shape) > 1 else 1)
    return total


def _role_memory(recipe: Recipe, spec: PlannedModel, world: int, pool: str, kv_rows: int) -> PlannedRole:
    # The rollout group has no role section: a replica per rank (ddp), nothing offloaded, no adapter.
    settings = None if spec.role == ROLLOUT_ROLE else recipe.roles[spec.role].settings
    lora = settings.lora if settings is not None and spec.role == "actor" else None
    model = _meta_model(spec.kind, spec.model, lora)
    strategy = "ddp" if settings is None else role_strategy(settings, world)
    fsdp = None if settings is None else settings.fsdp
    offload = fsdp is not None and bool(fsdp.cpu_offload)
    all_shapes, trained = _shapes(model, False), (_shapes(model, True) if spec.trainable else [])
    dtype = str(spec.model.dtype)
    shape = model_shape(model, spec.kind == "causal", dtype_bytes(dtype))
    kv = 0
    if spec.role == generating_role(recipe) and kv_rows and rollout_engine(recipe) == "hf":
        kv = engine_shape(recipe, shape).kv_cache_bytes(kv_rows, sequence_length(recipe))  # in rollout.dtype
    sharded = strategy == "fsdp2" and world > 1
    held = not _engine_holds_weights(recipe, spec.role)
    ranks = []
    for rank in range(world):
        trained_elements = _per_rank_elements(trained, world, rank, sharded)
        frozen_elements = _per_rank_elements(all_shapes, world, rank, sharded) - trained_elements
        params = trained_elements * _MASTER_BYTES + frozen_elements * shape.compute_bytes if held else 0
        grads = trained_elements * _MASTER_BYTES
        ranks.append(RankMemory(rank, params, grads, grads * _ADAM_MOMENTS, kv, offload))
    memory = RoleMemory(
        role=spec.role, pool=pool, world_size=world, strategy=strategy, trainable=spec.trainable,
        param_dtype="float32 (master)" if spec.trainable else dtype,
        parameters=sum(math.prod(shape) for shape in all_shapes),
        trainable_parameters=sum(math.prod(shape) for shape in trained), ranks=tuple(ranks),
        note=_role_note(recipe, spec, lora),
        param_offload=fsdp is not None and bool(fsdp.param_offload) and not offload,
        optimizer_offload=fsdp is not None and bool(fsdp.optimizer_offload) and not offload and spec.trainable,
    )
    return PlannedRole(memory, spec, shape)


def _engine_holds_weights(recipe: Recipe, role: str) -> bool:
    """True for the rollout group on the vllm engine: its HF weights are freed once the engine starts (the engine's term counts them)."""
    return role == ROLLOUT_ROLE and rollout_engine(recipe) == "vllm"


def _role_note(recipe: Recipe, spec: PlannedModel, lora: Any) -> str:
    """What the state table says beside a role: a trained LoRA adapter, or where the rollout group keeps its weights."""
    if spec.role == ROLLOUT_ROLE:
        return ("rollout replica: weights in the vLLM engine" if _engine_holds_weights(recipe, spec.role)
                else "rollout replica in rollout.dtype, no optimizer")
    return "LoRA: adapter trained" if spec.trainable and lora not in (None, False) else ""


def _planned_models(recipe: Recipe) -> list[PlannedModel]:
    """The roles with a model, what kind of model each builds, and whether it trains (the rollout group of
    ``rollout.placement: separate`` builds the actor's model, frozen)."""
    roles = recipe.roles
    stage = stage_of(recipe)
    specs = []
    if "actor" in roles and (stage is None or stage.trained_role == "actor"):
        specs.append(PlannedModel("actor", "causal", True, roles["actor"].model))
    if "actor" in roles and generating_role(recipe) == ROLLOUT_ROLE:  # rollout.placement: separate, in rollout.dtype
        specs.append(PlannedModel(ROLLOUT_ROLE, "causal", False,
                                  replace(roles["actor"].model, dtype=recipe.rollout.dtype)))
    if "reference" in roles and (stage is None or stage.algorithm == "dpo"):
        specs.append(PlannedModel("reference", "causal", False, roles["reference"].model))
    if stage is None:  # a teacher: frozen, scoring every sampled token
        specs += [PlannedModel(role, "causal", False, roles[role].model) for role in TOKEN_SCORING_ROLES if role in roles]
    if "critic" in roles and stage is None:
        specs.append(PlannedModel("critic", "value", True, roles["critic"].model))
    reward_trained = stage is not None and stage.trained_role == "reward"
    judge = roles["reward"].settings.get("judge") if "reward" in roles and stage is None else None
    if judge is not None:  # roles.reward.judge: a frozen causal LM on the reward role's pool, generating verdicts
        specs.append(PlannedModel("reward", "causal", False, judge.model))
    elif "reward" in roles and (reward_trained or (stage is None and roles["reward"].model is not None)):
        specs.append(PlannedModel("reward", "classifier", reward_trained, _reward_model(roles["reward"].model)))
    return specs


def _reward_model(model: ModelConfig | None) -> ModelConfig:
    """The trained reward role's model; one left null (validate's error) is planned on the default inline architecture."""
    return ModelConfig(config=dict(DEFAULT_INLINE_MODEL)) if model is None else model


# ------------------------------------------------------------------ the plan


def _cuda_memory() -> int | None:
    try:
        return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no usable CUDA device: the memory is unknown
        return None


def plan_memory(recipe: Recipe, pools: Mapping[str, Any], device_memory: int | None = None) -> MemoryPlan:
    """The memory plan of a resolved recipe on its pools (``rlhfctl.recipe.pools.PoolInfo``).

    A role whose model cannot be built from its config here (a hub id that is not local, say) is listed
    in ``skipped`` with the reason instead, and its pool's calls leave it out.
    """
    plan = MemoryPlan(device_memory=device_memory, device_source="--device-memory" if device_memory else None)
    if device_memory is None and any(getattr(pool, "use_gpu", False) for pool in pools.values()):
        plan.device_memory = _cuda_memory()
        plan.device_source = "cuda" if plan.device_memory else None
    members: dict[str, list[PlannedRole]] = {}
    for spec in _planned_models(recipe):
        pool = next((pool for pool in pools.values() if spec.role in pool.roles), None)
        if pool is None:
            continue
        world = int(pool.world_size)
        try:
            planned = _role_memory(recipe, spec, world, pool.name, generation_rows(recipe, world))
        except Exception as failure:  # noqa: BLE001 - reported per role; the rest of the plan still helps
            plan.skipped[spec.role] = str(failure) if isinstance(failure, VocabularyMismatch) else (
                f"{type(failure).__name__}: {failure}")
            continue
        plan.roles.append(planned.memory)
        members.setdefault(pool.name, []).append(planned)
    for name, planned in members.items():
        use_gpu = bool(getattr(pools[name], "use_gpu", False))
        plan.phases[name] = pool_phases(recipe, planned, use_gpu, plan.device_memory)
        holder = next((item for item in planned if item.memory.role == generating_role(recipe)), None)
        if holder is not None and use_gpu and plan.device_memory and stage_of(recipe) is None and rollout_engine(recipe) == "vllm":
            nodes = tuple(getattr(pools[name], "process_on_nodes", ()) or (holder.memory.world_size,))
            plan.engines[name] = engine_fit(recipe, holder, nodes, plan.device_memory)
    return plan
