"""The memory plan: what each process holds during each call of a step, predicted before launch with no weights loaded.

For every role with a model, the model is built from its config on the meta device (shapes only) to
count its parameters. Then, per rank:

- **state** (every call): trainable roles keep float32 master weights and AdamW's two float32
  moments, frozen roles store ``model.dtype``; ``ddp`` holds a full replica, ``fsdp2`` shards every
  tensor on its first dimension (``ceil(rows / world)`` rows per rank, rank 0 holds the most);
  ``fsdp.cpu_offload`` keeps the sharded state in host memory. Gradients exist only inside the role's
  own update: ``zero_grad(set_to_none=True)`` frees them after every optimizer step.
- **per call**, on top of the state of every role colocated in the process (one process per rank
  hosts all of a pool's roles):

  - ``actor.generate_sequences`` (rollout): on the hf engine, the whole model gathered in compute
    dtype (``workers.engine.serving``), the KV cache and the prefill's activations; on the vllm
    engine, ``rollout.vllm.gpu_memory_utilization`` x the device (vLLM's budget for its weights, KV
    cache and activations, a per-instance share of the device's total).
  - log-prob passes (``compute_ref_log_prob``, ``compute_log_prob``, ``compute_values``, a reward
    model's ``compute_rewards``): the whole model gathered (fsdp2), one micro-batch's activations and
    its logits (compute dtype, plus :data:`LOGIT_FP32_COPIES` float32 copies through log-softmax and
    entropy, over :data:`LOGPROB_CHUNK_TOKENS` tokens at a time when the pass is chunked).
  - updates (``update_critic``, ``update_actor``, a stage's ``train_*``): gradients, FSDP2's gathered
    units (the root unit and two decoder layers, the root's unsharded gradients and a float32 copy
    for the reduce-scatter), one micro-batch's activations (layer inputs only under gradient
    checkpointing) and logits.
- **every process**: the CUDA context and NCCL buffers (:data:`CONTEXT_BYTES`); a sleeping vLLM
  engine's residue (:data:`VLLM_ASLEEP_BYTES`) outside the rollout.

:meth:`MemoryPlan.phase_bytes` gives the bytes of each call for one pool's rank; the peak call is
what must fit the device. ``memory/<role>/state_gib`` measures the state from the live tensors every
step (``workers.memory``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = [
    "CONTEXT_BYTES",
    "LOGIT_FP32_COPIES",
    "LOGPROB_CHUNK_TOKENS",
    "VLLM_ASLEEP_BYTES",
    "MemoryPlan",
    "Misfit",
    "Phase",
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
_FP32 = 4
#: CUDA context + NCCL communicator buffers per GPU process, outside torch's allocator (so outside
#: ``max_memory_allocated``). The context is about 0.3-0.6 GiB on CUDA 12 with lazy module loading;
#: NCCL allocates NCCL_BUFFSIZE (4 MiB) per channel and peer, a few hundred MiB at world 8
#: (NCCL's environment-variable docs); 1 GiB covers both.
CONTEXT_BYTES = 1 * GIB
#: What a vLLM engine keeps on the device while asleep at level 2 (weights and KV cache freed): its
#: CUDA-graph pool and NCCL communicator stay resident (vLLM's sleep-mode docs; vllm-project/vllm PR
#: 45623 lists both as memory that sleep does not release), about 1 GiB for a 7B model at TP 1.
VLLM_ASLEEP_BYTES = 1 * GIB
#: Float32 copies of a pass's logits: the ``.float()`` cast, the temperature division, log-softmax,
#: and the entropy's probabilities (``workers/log_probs.py``), on top of the model's compute-dtype output.
LOGIT_FP32_COPIES = 4
#: Tokens per chunk of the log-prob and entropy pass (``workers/log_probs.py``); None: the pass
#: takes a whole micro-batch's logits at once. The one place the plan reads that size.
LOGPROB_CHUNK_TOKENS: int | None = None

_SIZE_UNITS = {"mb": 10**6, "gb": 10**9, "tb": 10**12, "mib": 2**20, "gib": 2**30, "tib": 2**40}
ROLLOUT, LOG_PROBS, UPDATE = "rollout", "log-prob passes", "update"


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
    from rlhfctl.recipe.resolve import resolve_strategy

    return resolve_strategy(role_section.get("strategy") or None, world_size)


@dataclass(frozen=True)
class RankMemory:
    """Bytes of state one rank of one role holds."""

    rank: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    kv_cache_bytes: int
    offloaded: bool

    @property
    def state_bytes(self) -> int:
        """Parameters + gradients + optimizer state (what ``memory/<role>/state_gib`` measures)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def device_bytes(self) -> int:
        """The state unless offloaded, plus the hf engine's KV cache (the per-call view is :class:`Phase`)."""
        return (0 if self.offloaded else self.state_bytes) + self.kv_cache_bytes


@dataclass(frozen=True)
class RoleMemory:
    """One role's plan: what it is, and what state each of its ranks holds."""

    role: str
    pool: str
    world_size: int
    strategy: str
    trainable: bool
    param_dtype: str
    parameters: int
    trainable_parameters: int
    ranks: tuple[RankMemory, ...]
    note: str = ""

    @property
    def largest(self) -> RankMemory:
        """The rank holding the most (rank 0 when shards are uneven)."""
        return max(self.ranks, key=lambda rank: (rank.device_bytes, rank.state_bytes))


@dataclass(frozen=True)
class Term:
    """One thing a process holds during a call: its name, whose, the knob kind, bytes (None: unknown here) and formula."""

    name: str
    role: str
    kind: str  # state | gradients | unshard | kv_cache | activations | logits | engine | residue | context
    bytes: int | None
    formula: str


@dataclass(frozen=True)
class Phase:
    """One call of the step in one process (a pool's rank): its group (rollout, log-prob passes, update) and terms."""

    call: str
    group: str
    rank: int
    terms: tuple[Term, ...]

    @property
    def total(self) -> int:
        """Bytes of the known terms."""
        return sum(term.bytes or 0 for term in self.terms)

    @property
    def context(self) -> int:
        """Bytes outside torch's allocator (the CUDA context and NCCL buffers)."""
        return sum(term.bytes or 0 for term in self.terms if term.kind == "context")

    @property
    def unknown(self) -> list[str]:
        """Terms whose size needs the device memory (the vLLM share without ``--device-memory``)."""
        return [term.name for term in self.terms if term.bytes is None]


@dataclass(frozen=True)
class Misfit:
    """A call whose process needs more than the device has, and the knobs that would help most."""

    pool: str
    call: str
    needed: int
    device: int
    knobs: tuple[str, ...]

    @property
    def message(self) -> str:
        """One line: what does not fit, by how much, and what to change."""
        over = (self.needed - self.device) / GIB
        return (f"memory plan: pool {self.pool} needs {self.needed / GIB:.1f} GiB in {self.call}, "
                f"{over:.1f} GiB more than the device's {self.device / GIB:.1f} GiB; try {'; or '.join(self.knobs)}")


@dataclass
class MemoryPlan:
    """Every role's state, every pool's per-call plan per rank, and the device memory to compare with."""

    roles: list[RoleMemory] = field(default_factory=list)
    device_memory: int | None = None
    device_source: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    phases: dict[str, list[Phase]] = field(default_factory=dict)  # pool -> every call of every rank

    def phase_bytes(self, pool: str, rank: int = 0, *, allocated_only: bool = False) -> dict[str, int]:
        """Predicted device bytes of ``pool``'s process ``rank`` during each call of the step, keyed by the
        call (``"actor.generate_sequences"``, ``"actor.compute_log_prob"``, ``"actor.update_actor"``, ...) in
        step order; :attr:`Phase.group` of each is rollout, log-prob passes or update.

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
        """Each pool's calls that need more than ``device_memory`` (largest rank), with the knobs that help."""
        if not self.device_memory:
            return []
        found = []
        for pool in self.phases:
            worst: dict[str, Phase] = {}
            for phase in self.phases[pool]:
                if phase.call not in worst or phase.total > worst[phase.call].total:
                    worst[phase.call] = phase
            for phase in worst.values():
                if phase.total > self.device_memory:
                    over = phase.total - self.device_memory
                    found.append(Misfit(pool, phase.call, phase.total, self.device_memory,
                                        _knobs(phase, over, self.device_memory, self.roles)))
        return found

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
                "skipped": dict(self.skipped)}


def _knobs(phase: Phase, over: int, device: int, roles: list[RoleMemory]) -> tuple[str, ...]:
    """The settings that shrink this call's terms, the ones acting on the most bytes first (at most three)."""
    acting: dict[str, int] = {}
    for term in phase.terms:
        for knob in _knobs_for(term, phase, over, device, roles):
            acting[knob] = acting.get(knob, 0) + (term.bytes or 0)
    ranked = sorted(acting.items(), key=lambda item: -item[1])
    return tuple(f"{knob} (acts on {size / GIB:.1f} GiB)" for knob, size in ranked[:3]) or ("more ranks",)


def _knobs_for(term: Term, phase: Phase, over: int, device: int, roles: list[RoleMemory]) -> list[str]:
    """What shrinks one term: vLLM's share, offload or more ranks for state, smaller micro-batches for activations."""
    role = next((item for item in roles if item.role == term.role), None)
    ranks = f"more ranks (resource_pools.{role.pool}.process_on_nodes, now {role.world_size})" if role else ""
    if term.kind == "engine" and term.bytes:
        fits = (term.bytes - over) / device
        return [f"rollout.vllm.gpu_memory_utilization {fits:.2f} (now {term.bytes / device:.2f})" if fits > 0
                else "a lower rollout.vllm.gpu_memory_utilization"]
    if term.kind in ("state", "gradients") and role is not None:
        return [f"roles.{term.role}.fsdp.cpu_offload: true", ranks]
    if term.kind in ("activations", "logits") and role is not None:
        if phase.group == UPDATE:
            return [f"a smaller roles.{term.role}.micro_batch_tokens (or micro_batch_size)"]
        return [ranks] if term.role == "reference" else [f"a smaller roles.{term.role}.micro_batch_size", ranks]
    if term.kind == "kv_cache" and role is not None:
        return [ranks, "rollout.engine: vllm"]
    return []


# ------------------------------------------------------------------ the model's shapes


def _dtype_bytes(dtype: Any) -> int:
    from rlhfctl.models.loading import resolve_dtype

    resolved = resolve_dtype(str(dtype))
    return torch.tensor([], dtype=resolved if isinstance(resolved, torch.dtype) else torch.float32).element_size()


def _meta_model(kind: str, model_cfg: Mapping[str, Any], lora: Any) -> torch.nn.Module:
    """The role's model with meta tensors: the same loaders the workers use, on inline config fields."""
    from rlhfctl.models import loading

    inline = dict(model_cfg)
    if inline.get("path"):  # the config only, from a local directory or the HF cache: validate never downloads
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(os.path.expanduser(str(inline["path"])), local_files_only=True,
                                                trust_remote_code=bool(inline.get("trust_remote_code")))
        except OSError:
            raise LookupError(f"{inline['path']} is neither a local directory nor in the Hugging Face cache, "
                              "and the plan reads only local configs") from None
        inline = {**inline, "path": None, "tokenizer_path": None, "config": config.to_dict()}
    tokenizer = loading.load_tokenizer(inline, trust_remote_code=bool(inline.get("trust_remote_code")))
    build = {"causal": loading.load_causal_lm, "value": loading.load_token_value_model,
             "classifier": loading.load_sequence_classifier}[kind]
    with torch.device("meta"):
        model = build(inline, tokenizer, dtype=None, trust_remote_code=bool(inline.get("trust_remote_code")), seed=0)
        if lora is not None and lora is not False:
            from workers.lora import apply_lora

            model = apply_lora(model, {} if lora is True else lora, seed=0)
    return model


@dataclass(frozen=True)
class _Shape:
    """What the per-call terms need of a model: sizes, and how its parameters split into FSDP2 units."""

    hidden: int
    intermediate: int
    layers: int
    kv_dim: int
    vocab: int
    causal: bool
    parameters: int
    layer_params: int  # the largest decoder layer
    root_params: int  # outside the decoder layers: embeddings, head, final norm (FSDP2's root unit)
    root_trainable: int
    compute_bytes: int

    def kv_cache_bytes(self, rows: int, length: int) -> int:
        """Rows x length x layers x KV width x 2 (keys and values) x compute bytes."""
        return rows * length * self.layers * self.kv_dim * 2 * self.compute_bytes

    @property
    def forward_width(self) -> int:
        """Elements per token alive inside one layer's forward: about 4 x hidden + 3 x intermediate."""
        return 4 * self.hidden + 3 * self.intermediate

    @property
    def saved_width(self) -> int:
        """Elements per token one layer saves for backward: 6 x hidden + 2 x KV width + 4 x intermediate."""
        return 6 * self.hidden + 2 * self.kv_dim + 4 * self.intermediate


def _shape(model: torch.nn.Module, causal: bool, compute_bytes: int) -> _Shape:
    from workers.engine import decoder_layers

    config = model.config
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    layers = decoder_layers(model)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    root = [p for p in model.parameters() if id(p) not in in_layers]
    return _Shape(
        hidden=int(config.hidden_size), intermediate=int(getattr(config, "intermediate_size", 4 * config.hidden_size)),
        layers=int(config.num_hidden_layers), kv_dim=kv_heads * head_dim, vocab=int(config.vocab_size), causal=causal,
        parameters=sum(p.numel() for p in model.parameters()),
        layer_params=max((sum(p.numel() for p in layer.parameters()) for layer in layers), default=0),
        root_params=sum(p.numel() for p in root), root_trainable=sum(p.numel() for p in root if p.requires_grad),
        compute_bytes=compute_bytes,
    )


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


@dataclass(frozen=True)
class _RoleSpec:
    role: str
    kind: str  # causal | value | classifier
    trainable: bool
    model_cfg: dict[str, Any]


@dataclass(frozen=True)
class _Planned:
    """A role's state plan with what its per-call terms need."""

    memory: RoleMemory
    spec: _RoleSpec
    shape: _Shape
    section: dict[str, Any]


def _role_memory(recipe: Mapping[str, Any], spec: _RoleSpec, world: int, pool: str, kv_rows: int) -> _Planned:
    from workers.recipe import section

    role_section = section(recipe, "roles", spec.role)
    model = _meta_model(spec.kind, spec.model_cfg, role_section.get("lora") if spec.role == "actor" else None)
    strategy = role_strategy(role_section, world)
    offload = bool((role_section.get("fsdp") or {}).get("cpu_offload"))
    all_shapes, trained = _shapes(model, False), (_shapes(model, True) if spec.trainable else [])
    dtype = str(spec.model_cfg.get("dtype") or "float32")
    shape = _shape(model, spec.kind == "causal", _dtype_bytes(dtype))
    kv = 0
    if spec.role == "actor" and kv_rows and _engine(recipe) == "hf":
        kv = shape.kv_cache_bytes(kv_rows, _sequence_length(recipe))
    sharded = strategy == "fsdp2" and world > 1
    ranks = []
    for rank in range(world):
        trained_elements = _per_rank_elements(trained, world, rank, sharded)
        frozen_elements = _per_rank_elements(all_shapes, world, rank, sharded) - trained_elements
        params = trained_elements * _MASTER_BYTES + frozen_elements * shape.compute_bytes
        grads = trained_elements * _MASTER_BYTES
        ranks.append(RankMemory(rank, params, grads, grads * _ADAM_MOMENTS, kv, offload))
    memory = RoleMemory(
        role=spec.role, pool=pool, world_size=world, strategy=strategy, trainable=spec.trainable,
        param_dtype="float32 (master)" if spec.trainable else dtype,
        parameters=sum(math.prod(shape) for shape in all_shapes),
        trainable_parameters=sum(math.prod(shape) for shape in trained), ranks=tuple(ranks),
        note="LoRA: adapter trained" if spec.trainable and role_section.get("lora") not in (None, False) else "",
    )
    return _Planned(memory, spec, shape, role_section)


def _role_specs(recipe: Mapping[str, Any]) -> list[_RoleSpec]:
    """The roles with a model, what kind of model each builds, and whether it trains."""
    from workers.recipe import model_config

    roles = recipe.get("roles") or {}
    stage = _stage(recipe)
    present = {name for name, section in roles.items() if section is not None}
    specs = []
    if "actor" in present and (stage is None or stage.trained_role == "actor"):
        specs.append(_RoleSpec("actor", "causal", True, model_config(recipe, "actor")))
    if "reference" in present and (stage is None or stage.algorithm == "dpo"):
        specs.append(_RoleSpec("reference", "causal", False, model_config(recipe, "reference", fallback="actor")))
    if "critic" in present and stage is None:
        specs.append(_RoleSpec("critic", "value", True, model_config(recipe, "critic", fallback="actor")))
    reward_trained = stage is not None and stage.trained_role == "reward"
    if "reward" in present and (reward_trained or (stage is None and (roles["reward"] or {}).get("model"))):
        specs.append(_RoleSpec("reward", "classifier", reward_trained, model_config(recipe, "reward")))
    return specs


# ------------------------------------------------------------------ the recipe's sizes, schema defaults filled in


def _stage(recipe: Mapping[str, Any]) -> Any:
    """The supervised stage ``algorithm.name`` names (``rlhfctl.recipe.stages.STAGES``), or None for the PPO family."""
    from rlhfctl.recipe.stages import STAGES

    return STAGES.get(str((recipe.get("algorithm") or {}).get("name") or "ppo"))


def _engine(recipe: Mapping[str, Any]) -> str:
    from workers.recipe import rollout_config

    return str(rollout_config(recipe)["engine"])


def _data(recipe: Mapping[str, Any]) -> dict[str, Any]:
    from rlhfctl.recipe.schema import DataConfig, defaults_of
    from workers.recipe import section

    return {**defaults_of(DataConfig), **{k: v for k, v in section(recipe, "data").items() if v is not None}}


def _sequence_length(recipe: Mapping[str, Any]) -> int:
    """Prompt + response tokens of a rollout row (``data.max_prompt_length`` + ``rollout.max_new_tokens``)."""
    from workers.recipe import rollout_config

    return int(_data(recipe)["max_prompt_length"]) + int(rollout_config(recipe)["max_new_tokens"])


def _samples(recipe: Mapping[str, Any]) -> int:
    from workers.recipe import rollout_config, trainer_config

    return int(trainer_config(recipe)["batch_size"]) * int(rollout_config(recipe)["n"])


# ------------------------------------------------------------------ the terms of each call


def _gib(count: int | None) -> str:
    return "?" if count is None else f"{count / GIB:.2f} GiB"


def _state_terms(planned: _Planned, rank: int) -> list[Term]:
    """What a role keeps between calls: its (master) weights and optimizer moments, unless offloaded."""
    memory, state = planned.memory, planned.memory.ranks[rank]
    if state.offloaded:
        return [Term(f"{memory.role} state (offloaded)", memory.role, "state", 0,
                     f"fsdp.cpu_offload: {_gib(state.param_bytes + state.optimizer_bytes)} in host memory")]
    where = f"/ {memory.world_size} ranks ({memory.strategy})" if memory.strategy == "fsdp2" and memory.world_size > 1 else "(replica)"
    terms = [Term(f"{memory.role} weights", memory.role, "state", state.param_bytes,
                  f"{_count(memory.parameters)} params x {'4 B fp32 master' if memory.trainable else f'{planned.shape.compute_bytes} B'} {where}")]
    if state.optimizer_bytes:
        terms.append(Term(f"{memory.role} optimizer", memory.role, "state", state.optimizer_bytes,
                          f"{_count(memory.trainable_parameters)} trained x 2 AdamW moments x 4 B {where}"))
    return terms


def _gathered_weights(planned: _Planned) -> list[Term]:
    """The whole model in compute dtype while ``serving`` holds it unsharded (fsdp2), or autocast's cached casts (ddp)."""
    memory, shape = planned.memory, planned.shape
    if memory.strategy == "fsdp2":
        return [Term(f"{memory.role} gathered weights", memory.role, "unshard", shape.parameters * shape.compute_bytes,
                     f"{_count(shape.parameters)} params x {shape.compute_bytes} B: every FSDP2 unit unsharded (serving)")]
    if memory.trainable and shape.compute_bytes < _FP32:
        return [Term(f"{memory.role} autocast casts", memory.role, "unshard", memory.trainable_parameters * shape.compute_bytes,
                     f"{_count(memory.trainable_parameters)} params x {shape.compute_bytes} B cached by autocast")]
    return []


def _logits(role: str, shape: _Shape, tokens: int, chunk: int | None) -> Term:
    """A pass's logits: the compute-dtype output plus the float32 copies, chunked or whole."""
    chunked = tokens if chunk is None else min(tokens, chunk)
    size = tokens * shape.vocab * shape.compute_bytes + chunked * shape.vocab * _FP32 * LOGIT_FP32_COPIES
    return Term(f"{role} logits", role, "logits", size,
                f"{tokens} tokens x vocab {shape.vocab} x {shape.compute_bytes} B + {chunked} tokens x vocab x 4 B x {LOGIT_FP32_COPIES} fp32 copies")


def _pass_terms(planned: _Planned, rows: int, length: int, response: int) -> list[Term]:
    """A no-grad pass over ``rows`` rows of ``length`` tokens: gathered weights, one layer's activations, logits."""
    role, shape = planned.memory.role, planned.shape
    tokens = rows * length
    terms = _gathered_weights(planned) + [
        Term(f"{role} activations", role, "activations", tokens * shape.forward_width * shape.compute_bytes,
             f"{rows} rows x {length} tokens x (4 x {shape.hidden} + 3 x {shape.intermediate}) x {shape.compute_bytes} B")]
    if shape.causal:
        terms.append(_logits(role, shape, rows * (response + 1), LOGPROB_CHUNK_TOKENS))
    return terms


def _update_terms(planned: _Planned, rank: int, tokens: int, logit_tokens: int, checkpointing: bool) -> list[Term]:
    """One micro-batch's forward and backward: gradients, FSDP2's gathered units, activations, logits."""
    memory, shape, c = planned.memory, planned.shape, planned.shape.compute_bytes
    role, state = memory.role, memory.ranks[rank]
    terms = [Term(f"{role} gradients", role, "gradients", 0 if state.offloaded else state.grad_bytes,
                  f"{_count(memory.trainable_parameters)} trained x 4 B" + (" (offloaded)" if state.offloaded else ""))]
    if memory.strategy == "fsdp2":
        unit = max(shape.root_trainable, shape.layer_params if memory.trainable_parameters == memory.parameters else 0)
        size = (shape.root_params + 2 * shape.layer_params + shape.root_trainable) * c + unit * _FP32
        terms.append(Term(f"{role} gathered units", role, "unshard", size,
                          f"(root {_count(shape.root_params)} + 2 layers x {_count(shape.layer_params)} + root grads "
                          f"{_count(shape.root_trainable)}) x {c} B + {_count(unit)} x 4 B reduce copy"))
    else:
        terms += _gathered_weights(planned)
    layers = 1 if checkpointing else shape.layers
    saved = tokens * shape.saved_width * c * layers + (tokens * shape.hidden * c * shape.layers if checkpointing else 0)
    how = f"+ {shape.layers} layer inputs x {shape.hidden} (checkpointed)" if checkpointing else f"x {shape.layers} layers"
    terms.append(Term(f"{role} activations", role, "activations", saved,
                      f"{tokens} tokens x (6 x {shape.hidden} + 2 x {shape.kv_dim} + 4 x {shape.intermediate}) x {c} B {how}"))
    if shape.causal:
        terms.append(_logits(role, shape, logit_tokens, None))
    return terms


def _count(number: int) -> str:
    for suffix, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if number >= size:
            return f"{number / size:.2f}{suffix}"
    return str(number)


@dataclass(frozen=True)
class _Engine:
    """The rollout engine's presence in the actor's process: awake in the rollout, and outside it."""

    rollout: tuple[Term, ...]
    between: tuple[Term, ...]


def _vllm_engine(recipe: Mapping[str, Any], actor: _Planned, use_gpu: bool, device_memory: int | None) -> _Engine:
    """vLLM's share while awake (``gpu_memory_utilization`` x the device) and its residue asleep; on CPU its weights + KV."""
    from workers.recipe import rollout_config
    from workers.sampling.vllm_engine import engine_settings

    settings = engine_settings(rollout_config(recipe))
    if not use_gpu:
        weights = actor.shape.parameters * actor.shape.compute_bytes
        kv = int(float(settings["cpu_kv_cache_gib"]) * GIB)
        term = Term("vLLM engine", "actor", "engine", weights + kv,
                    f"weights {_count(actor.shape.parameters)} x {actor.shape.compute_bytes} B + rollout.vllm.cpu_kv_cache_gib {settings['cpu_kv_cache_gib']}")
        return _Engine((term,), (term,))
    share = float(settings["gpu_memory_utilization"])
    awake = Term("vLLM engine (awake)", "actor", "engine", None if device_memory is None else int(share * device_memory),
                 f"rollout.vllm.gpu_memory_utilization {share:g} x device {_gib(device_memory)}: weights, KV cache, activations")
    if not settings["enable_sleep_mode"]:
        return _Engine((awake,), (awake,))
    asleep = Term("vLLM engine (asleep)", "actor", "residue", VLLM_ASLEEP_BYTES,
                  "sleep level 2 frees weights and KV cache; CUDA graphs and NCCL buffers stay")
    return _Engine((awake,), (asleep,))


def _hf_rollout(recipe: Mapping[str, Any], actor: _Planned, rank: int) -> tuple[Term, ...]:
    """The actor's own sampler: the whole model gathered, the KV cache, the prefill's activations, the step's logits."""
    shape, rows = actor.shape, math.ceil(_samples(recipe) / actor.memory.world_size)
    prompt, length = int(_data(recipe)["max_prompt_length"]), _sequence_length(recipe)
    kv = actor.memory.ranks[rank].kv_cache_bytes
    prefill = rows * prompt * shape.forward_width * shape.compute_bytes
    sampling = rows * shape.vocab * _FP32 * LOGIT_FP32_COPIES
    return tuple(_gathered_weights(actor)) + (
        Term("actor KV cache", "actor", "kv_cache", kv,
             f"{rows} rows x {length} tokens x {shape.layers} layers x KV width {shape.kv_dim} x 2 x {shape.compute_bytes} B"),
        Term("actor activations", "actor", "activations", prefill,
             f"prefill {rows} rows x {prompt} tokens x (4 x {shape.hidden} + 3 x {shape.intermediate}) x {shape.compute_bytes} B"),
        Term("actor logits", "actor", "logits", sampling, f"{rows} rows x vocab {shape.vocab} x 4 B x {LOGIT_FP32_COPIES} copies per step"),
    )


# ------------------------------------------------------------------ the calls of a step, per process


def _role_settings(recipe: Mapping[str, Any], role: str) -> dict[str, Any]:
    from workers import recipe as sections

    defaults = {"actor": sections.ACTOR_DEFAULTS, "reference": sections.REFERENCE_DEFAULTS,
                "critic": sections.CRITIC_DEFAULTS, "reward": sections.REWARD_DEFAULTS}[role]
    return sections.role_config(recipe, role, defaults)


def _needs_old_log_probs(recipe: Mapping[str, Any]) -> bool:
    from rlhfctl.recipe.resolve import needs_old_log_probs

    try:
        return needs_old_log_probs(recipe)
    except (KeyError, TypeError, ValueError):  # a partial recipe (a test's, a script's): count the pass
        return True


def _update_call(recipe: Mapping[str, Any], planned: _Planned, rank: int, rows: int, length: int, response: int) -> list[Term]:
    """An update's micro-batch: ``micro_batch_tokens`` tokens, or ``micro_batch_size`` (else a mini-batch's) rows."""
    from rlhfctl.recipe.resolve import samples_per_rank
    from workers.recipe import rollout_config

    settings = _role_settings(recipe, planned.memory.role)
    budget = settings.get("micro_batch_tokens")
    micro = settings.get("micro_batch_size") or samples_per_rank(
        settings.get("mini_batch_size"), int(rollout_config(recipe)["n"]), planned.memory.world_size, rows)
    tokens, logit_tokens = (int(budget), int(budget)) if budget else (micro * length, micro * (response + 1))
    checkpointing = bool(planned.spec.model_cfg.get("gradient_checkpointing"))
    return _update_terms(planned, rank, tokens, logit_tokens, checkpointing)


def _ppo_calls(recipe: Mapping[str, Any], roles: Mapping[str, _Planned], rank: int,
               engine: _Engine | None) -> list[tuple[str, str, list[Term]]]:
    """(call, group, its own terms) for the PPO step's calls of the roles in one process, in step order."""
    from rlhfctl.recipe.resolve import reference_source
    from workers.recipe import rollout_config

    length, response = _sequence_length(recipe), int(rollout_config(recipe)["max_new_tokens"])
    rows = {role: math.ceil(_samples(recipe) / planned.memory.world_size) for role, planned in roles.items()}
    micro = {role: _role_settings(recipe, role).get("micro_batch_size") for role in roles if role != "reward"}
    calls: list[tuple[str, str, list[Term]]] = []
    if "actor" in roles:
        rollout = list(engine.rollout) if engine else list(_hf_rollout(recipe, roles["actor"], rank))
        calls.append(("actor.generate_sequences", ROLLOUT, rollout))
    if "reward" in roles:
        batch = _role_settings(recipe, "reward").get("batch_size") or rows["reward"]
        calls.append(("reward.compute_rewards", LOG_PROBS, _pass_terms(roles["reward"], min(batch, rows["reward"]), length, response)))
    if "reference" in roles:
        calls.append(("reference.compute_ref_log_prob", LOG_PROBS, _pass_terms(roles["reference"], rows["reference"], length, response)))
    elif "actor" in roles and reference_source(recipe) == "actor":
        calls.append(("actor.compute_ref_log_prob", LOG_PROBS, _pass_terms(roles["actor"], micro["actor"] or rows["actor"], length, response)))
    if "critic" in roles:
        calls.append(("critic.compute_values", LOG_PROBS, _pass_terms(roles["critic"], micro["critic"] or rows["critic"], length, response)))
    if "actor" in roles and _needs_old_log_probs(recipe):
        calls.append(("actor.compute_log_prob", LOG_PROBS, _pass_terms(roles["actor"], micro["actor"] or rows["actor"], length, response)))
    for role, method in (("critic", "update_critic"), ("actor", "update_actor")):
        if role in roles:
            calls.append((f"{role}.{method}", UPDATE, _update_call(recipe, roles[role], rank, rows[role], length, response)))
    return calls


def _stage_calls(recipe: Mapping[str, Any], roles: Mapping[str, _Planned], rank: int) -> list[tuple[str, str, list[Term]]]:
    """A supervised stage's calls: dpo's reference pass, then the trained role's training step."""
    from workers.recipe import trainer_config

    stage = _stage(recipe)
    assert stage is not None
    length = int(_data(recipe)["max_length"])
    pairs = 2 if stage.record_kind == "preferences" else 1
    calls: list[tuple[str, str, list[Term]]] = []
    for role, planned in roles.items():
        rows = math.ceil(int(trainer_config(recipe)["batch_size"]) / planned.memory.world_size) * pairs
        if role == stage.trained_role:
            calls.append((f"{role}.{stage.methods[1]}", UPDATE, _update_call(recipe, planned, rank, rows, length, length - 1)))
        elif role == "reference":
            calls.insert(0, ("reference.compute_ref_log_prob", LOG_PROBS, _pass_terms(planned, rows, length, length - 1)))
    return calls


def _pool_phases(recipe: Mapping[str, Any], members: list[_Planned], use_gpu: bool, device_memory: int | None) -> list[Phase]:
    """Every call of every rank of one pool's processes: the colocated roles' state, the engine, the call's own terms."""
    roles = {planned.memory.role: planned for planned in members}
    stage = _stage(recipe) is not None
    engine = None
    if "actor" in roles and not stage and _engine(recipe) == "vllm":
        engine = _vllm_engine(recipe, roles["actor"], use_gpu, device_memory)
    context = [Term("CUDA context + NCCL", "", "context", CONTEXT_BYTES, "per process, outside torch's allocator")] if use_gpu else []
    phases = []
    for rank in range(max(planned.memory.world_size for planned in members)):
        resident = context + [term for planned in members if rank < planned.memory.world_size
                              for term in _state_terms(planned, rank)]
        calls = _stage_calls(recipe, roles, rank) if stage else _ppo_calls(recipe, roles, rank, engine)
        for call, group, own in calls:
            between = list(engine.between) if engine is not None and group != ROLLOUT else []
            phases.append(Phase(call, group, rank, tuple(resident + between + own)))
    return phases


# ------------------------------------------------------------------ the plan


def _cuda_memory() -> int | None:
    try:
        return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no usable CUDA device: the memory is unknown
        return None


def plan_memory(recipe: Mapping[str, Any], pools: Mapping[str, Any], device_memory: int | None = None) -> MemoryPlan:
    """The memory plan of a resolved recipe (a plain mapping) on its pools (``rlhfctl.recipe.pools.PoolInfo``).

    A role whose model cannot be built from its config here (a hub id that is not local, say) is listed
    in ``skipped`` with the reason instead, and its pool's calls leave it out.
    """
    plan = MemoryPlan(device_memory=device_memory, device_source="--device-memory" if device_memory else None)
    if device_memory is None and any(getattr(pool, "use_gpu", False) for pool in pools.values()):
        plan.device_memory = _cuda_memory()
        plan.device_source = "cuda" if plan.device_memory else None
    members: dict[str, list[_Planned]] = {}
    for spec in _role_specs(recipe):
        pool = next((pool for pool in pools.values() if spec.role in pool.roles), None)
        if pool is None:
            continue
        world = int(pool.world_size)
        try:
            planned = _role_memory(recipe, spec, world, pool.name, math.ceil(_samples(recipe) / world))
        except Exception as failure:  # noqa: BLE001 - reported per role; the rest of the plan still helps
            plan.skipped[spec.role] = f"{type(failure).__name__}: {failure}"
            continue
        plan.roles.append(planned.memory)
        members.setdefault(pool.name, []).append(planned)
    for name, planned in members.items():
        plan.phases[name] = _pool_phases(recipe, planned, bool(getattr(pools[name], "use_gpu", False)), plan.device_memory)
    return plan
