"""What each call of a step holds in a GPU process, term by term: the part of the memory plan that
knows the workers' calls (:mod:`rlhfctl.recipe.memory_plan` builds the plan from it and shows it).

A call's :class:`Phase` holds the state of every role colocated in the process, the process's own
terms (the CUDA context; a sleeping vLLM engine's residue), and the call's: gathered weights, the KV
cache, activations, logits, gradients, the vLLM engine's share, a weight-sync bucket. Each :class:`Term`
carries its formula. The role that generates (:func:`generating_role`: the actor, or the rollout group
of ``rollout.placement: separate``) holds the engine; the rules of the engines are written once for both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from rlhfctl.engine.forward import SCORED_HEAD_FAMILIES
from rlhfctl.recipe.check_tensor_parallel import shard_problems
from rlhfctl.recipe.memory_state import PlannedModel, RoleMemory
from rlhfctl.recipe.resolve import ROLLOUT_ROLE, TOKEN_SCORING_ROLES, samples_per_rank
from rlhfctl.recipe.specs import Recipe
from rlhfctl.recipe.stages import STAGES, StageAlgorithm
from rlhfctl.rollout.vllm_engine import engine_settings

__all__ = [
    "CONTEXT_BYTES",
    "LOGIT_FP32_COPIES",
    "LOG_PROBS",
    "ROLLOUT",
    "SYNC",
    "UPDATE",
    "VLLM_ASLEEP_BYTES",
    "EngineFit",
    "ModelShape",
    "Phase",
    "PlannedRole",
    "Term",
    "dtype_bytes",
    "engine_fit",
    "engine_shape",
    "generating_role",
    "generation_rows",
    "model_shape",
    "pool_phases",
    "rollout_engine",
    "rows_per_step",
    "samples_per_step",
    "sequence_length",
    "stage_of",
]

GIB = 2**30
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
#: and the entropy's probabilities (``rlhfctl/engine/log_probs.py``), on top of the model's compute-dtype output.
LOGIT_FP32_COPIES = 4

ROLLOUT, LOG_PROBS, UPDATE = "rollout", "log-prob passes", "update"
SYNC = "weight sync"  # rollout.placement: separate: the actor's send_weights, the rollout group's receive_weights


@dataclass(frozen=True)
class Term:
    """One thing a process holds during a call: its name, whose, the knob kind, bytes (None: unknown here) and formula."""

    name: str
    role: str
    kind: str  # state | gradients | unshard | kv_cache | activations | logits | engine | residue | sync | context
    bytes: int | None
    formula: str
    scales_with: str = ""  # "key=value[,least]": the setting this term grows with linearly (a micro-batch), if any


@dataclass(frozen=True)
class Phase:
    """One call of the step in one process (a pool's rank): its group (rollout, log-prob passes, update, weight sync) and terms."""

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
class PlannedRole:
    """A role's state plan with what its per-call terms need."""

    memory: RoleMemory
    spec: PlannedModel
    shape: ModelShape


@dataclass(frozen=True)
class ModelShape:
    """What the per-call terms need of a model: sizes, and how its parameters split into FSDP2 units."""

    model_type: str
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
    largest_tensor: int = 0  # elements of the largest parameter (a weight-sync bucket holds whole tensors)
    attention_heads: int = 1
    kv_heads: int = 1
    head_dim: int = 0
    experts: str = ""  # a MoE model: "E experts, k active x I" (``intermediate`` is then the active experts' width)
    intermediate_size: int = 0  # the config's own ``intermediate_size`` (what vLLM's sharding rules read)

    def kv_heads_per_rank(self, tensor_parallel: int) -> int:
        """KV heads one tensor-parallel rank holds: ``kv_heads / t``, at least 1 (vLLM replicates a head past that)."""
        return max(1, math.ceil(self.kv_heads / tensor_parallel))

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


def model_shape(model: torch.nn.Module, causal: bool, compute_bytes: int) -> ModelShape:
    """The sizes of a (meta) model the terms need; its decoder layers as ``rlhfctl.engine.placement`` finds them for FSDP2."""
    from rlhfctl.engine.placement import decoder_layers  # keeps transformers (models.loading) off the CLI's fast path

    config = model.config
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    layers = decoder_layers(model)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    root = [p for p in model.parameters() if id(p) not in in_layers]
    intermediate, experts = _active_intermediate(config)
    return ModelShape(
        model_type=str(getattr(config, "model_type", "")), hidden=int(config.hidden_size), intermediate=intermediate,
        layers=int(config.num_hidden_layers), kv_dim=kv_heads * head_dim, vocab=int(config.vocab_size), causal=causal,
        parameters=sum(p.numel() for p in model.parameters()),
        layer_params=max((sum(p.numel() for p in layer.parameters()) for layer in layers), default=0),
        root_params=sum(p.numel() for p in root), root_trainable=sum(p.numel() for p in root if p.requires_grad),
        compute_bytes=compute_bytes, largest_tensor=max((p.numel() for p in model.parameters()), default=0),
        attention_heads=heads, kv_heads=kv_heads, head_dim=head_dim, experts=experts,
        intermediate_size=int(getattr(config, "intermediate_size", None) or 0),
    )


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a recipe dtype name (``auto``: float32, as the engine computes it)."""
    from rlhfctl.models.loading import resolve_dtype  # keeps transformers off the CLI's fast path

    resolved = resolve_dtype(str(dtype))
    return torch.tensor([], dtype=resolved if isinstance(resolved, torch.dtype) else torch.float32).element_size()


def engine_shape(recipe: Recipe, shape: ModelShape) -> ModelShape:
    """The generating role's model as its rollout engine holds it: weights, KV cache and activations in ``rollout.dtype``."""
    return replace(shape, compute_bytes=dtype_bytes(recipe.rollout.dtype))


def _active_intermediate(config: Any) -> tuple[int, str]:
    """The MLP width a token's activations go through, and a MoE note: a dense model's ``intermediate_size``; a MoE
    model's active experts (``num_experts_per_tok`` x the expert's width, ``moe_intermediate_size`` where the config
    has one (qwen2_moe, qwen3_moe), else ``intermediate_size`` (mixtral)) plus a shared expert's width. Every expert's
    parameters are resident all the same: the parameter count comes from the built model."""
    dense = int(getattr(config, "intermediate_size", None) or 4 * int(config.hidden_size))
    active = getattr(config, "num_experts_per_tok", None)
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if not active or not experts:
        return dense, ""
    width = int(getattr(config, "moe_intermediate_size", None) or dense)
    shared = int(getattr(config, "shared_expert_intermediate_size", None) or 0)
    note = f"{int(experts)} experts, {int(active)} active x {width}" + (f" + shared {shared}" if shared else "")
    return int(active) * width + shared, note


# ------------------------------------------------------------------ the recipe's sizes


def stage_of(recipe: Recipe) -> StageAlgorithm | None:
    """The supervised stage ``algorithm.name`` names (``rlhfctl.recipe.stages.STAGES``), or None for the PPO family."""
    return None if recipe.stage is None else STAGES[recipe.stage]


def generating_role(recipe: Recipe) -> str:
    """The role whose processes generate and hold the engine: ``rollout`` with ``rollout.placement: separate`` (PPO
    family only), else the actor."""
    return ROLLOUT_ROLE if recipe.stage is None and recipe.rollout.pool is not None else "actor"


def generation_rows(recipe: Recipe, world: int) -> int:
    """Rows one rank of the generating role samples per generate call: ``samples_per_step`` / ``world``, over
    ``rollout.stream_chunks`` calls with a separate rollout group (a colocated actor generates in one call)."""
    chunks = int(recipe.rollout.settings.stream_chunks) if generating_role(recipe) == ROLLOUT_ROLE else 1
    return math.ceil(rows_per_step(recipe) / chunks / world)


def rollout_engine(recipe: Recipe) -> str:
    """``rollout.engine``."""
    return recipe.rollout.engine


def sequence_length(recipe: Recipe) -> int:
    """Prompt + response tokens of a rollout row (``data.max_prompt_length`` + the response width: ``rollout.max_new_tokens``,
    or ``multi_turn.max_response_tokens`` for agent rollouts)."""
    return int(recipe.data.max_prompt_length) + recipe.rollout.response_width


def samples_per_step(recipe: Recipe) -> int:
    """``trainer.batch_size`` x ``rollout.n``."""
    return int(recipe.trainer.batch_size) * int(recipe.rollout.settings.n)


def rows_per_step(recipe: Recipe) -> int:
    """The most samples a step generates: ``samples_per_step``, times ``1 + trainer.max_staleness`` with partial
    rollouts (a segment continues the samples carried from up to that many earlier steps; the step trains at most
    ``samples_per_step`` of them)."""
    carried_steps = recipe.rollout.max_staleness if recipe.rollout.partial_budget is not None else 0
    return samples_per_step(recipe) * (1 + int(carried_steps))


# ------------------------------------------------------------------ the terms of each call


def _gib(count: int | None) -> str:
    return "?" if count is None else f"{count / GIB:.2f} GiB"


def _state_terms(planned: PlannedRole, rank: int, call: str, group: str) -> list[Term]:
    """What a role keeps during ``call``: its (master) weights and optimizer moments, on the device unless offloaded
    (``cpu_offload``: always; ``param_offload``: outside the role's own calls; ``optimizer_offload``: outside its
    update)."""
    memory, state = planned.memory, planned.memory.ranks[rank]
    if not state.state_bytes and not state.offloaded:
        return []  # nothing between calls: the rollout group's vLLM engine holds its weights
    if state.offloaded:
        return [Term(f"{memory.role} state (offloaded)", memory.role, "state", 0,
                     f"fsdp.cpu_offload: {_gib(state.param_bytes + state.optimizer_bytes)} in host memory")]
    own = call.split(".", 1)[0] == memory.role
    where = (f"/ {memory.world_size} ranks ({memory.strategy})" if memory.strategy == "fsdp2" and memory.world_size > 1
             else "(replica)")
    params = f"{_count(memory.parameters)} params x {_param_bytes(memory, planned.shape)} {where}"
    weights_here = own or not memory.param_offload
    if not weights_here:
        params = f"fsdp.param_offload: {_gib(state.param_bytes)} ({params}) in host memory outside {memory.role}'s calls"
    terms = [Term(f"{memory.role} weights", memory.role, "state", state.param_bytes if weights_here else 0, params)]
    if state.optimizer_bytes:
        moments = f"{_count(memory.trainable_parameters)} trained x 2 AdamW moments x 4 B {where}"
        moments_here = not memory.optimizer_offload or (own and group == UPDATE)
        if not moments_here:
            moments = f"fsdp.optimizer_offload: {_gib(state.optimizer_bytes)} ({moments}) in host memory outside the update"
        terms.append(Term(f"{memory.role} optimizer", memory.role, "state", state.optimizer_bytes if moments_here else 0,
                          moments))
    return terms


def _param_bytes(memory: RoleMemory, shape: ModelShape) -> str:
    """Bytes per parameter of a role's weights: float32 masters trained, compute dtype frozen; a LoRA actor's frozen
    base in compute dtype and its adapter as float32 masters."""
    trained, c = memory.trainable_parameters, shape.compute_bytes
    if trained == memory.parameters:
        return "4 B fp32 master"
    if not trained:
        return f"{c} B"
    return f"({_count(memory.parameters - trained)} frozen x {c} B + {_count(trained)} adapter x 4 B fp32)"


def _gathered_weights(planned: PlannedRole) -> list[Term]:
    """The whole model in compute dtype while ``serving`` holds it unsharded (fsdp2), or autocast's cached casts (ddp)."""
    memory, shape = planned.memory, planned.shape
    if memory.strategy == "fsdp2":
        return [Term(f"{memory.role} gathered weights", memory.role, "unshard", shape.parameters * shape.compute_bytes,
                     f"{_count(shape.parameters)} params x {shape.compute_bytes} B: every FSDP2 unit unsharded (serving)")]
    if memory.trainable and shape.compute_bytes < _FP32:
        return [Term(f"{memory.role} autocast casts", memory.role, "unshard", memory.trainable_parameters * shape.compute_bytes,
                     f"{_count(memory.trainable_parameters)} params x {shape.compute_bytes} B cached by autocast")]
    return []


def _scoring_weights(planned: PlannedRole) -> list[Term]:
    """A no-grad pass's weights (fsdp2): FSDP2's per-unit unshard, the root unit (embeddings, head, final norm) and two
    decoder layers (the one running and the one prefetched) at a time, as the update counts them; ddp as gathered."""
    memory, shape = planned.memory, planned.shape
    if memory.strategy != "fsdp2":
        return _gathered_weights(planned)
    size = (shape.root_params + 2 * shape.layer_params) * shape.compute_bytes
    return [Term(f"{memory.role} gathered units", memory.role, "unshard", size,
                 f"(root {_count(shape.root_params)} + 2 layers x {_count(shape.layer_params)}) x {shape.compute_bytes} B: "
                 "FSDP2 unshards one unit at a time")]


def _logit_chunk(shape: ModelShape) -> int | None:
    """Tokens a log-prob pass scores at once: the pass's own chunk where the model's head scores in chunks, else None."""
    from rlhfctl.engine.log_probs import LOGITS_CHUNK_TOKENS  # the chunk's one home; keeps transformers off the CLI's fast path

    return int(LOGITS_CHUNK_TOKENS) if LOGITS_CHUNK_TOKENS and shape.model_type in SCORED_HEAD_FAMILIES else None


def _logits(role: str, shape: ModelShape, tokens: int, knob: str = "") -> Term:
    """A pass's logits of ``tokens`` response positions: compute-dtype output plus float32 copies, one chunk at a time
    where the pass is chunked (with gradients, each chunk is recomputed in backward, so one chunk's exist at once)."""
    chunk = _logit_chunk(shape)
    held = tokens if chunk is None else min(tokens, chunk)
    size = held * shape.vocab * (shape.compute_bytes + _FP32 * LOGIT_FP32_COPIES)
    how = f"one chunk of {held} of {tokens} tokens" if chunk is not None else f"{tokens} tokens (unchunked)"
    return Term(f"{role} logits", role, "logits", size,
                f"{how} x vocab {shape.vocab} x ({shape.compute_bytes} B + {LOGIT_FP32_COPIES} fp32 copies x 4 B)",
                knob if chunk is None or tokens < chunk else "")


def _pass_terms(planned: PlannedRole, rows: int, length: int, response: int, knob: str = "") -> list[Term]:
    """A no-grad pass over ``rows`` rows of ``length`` tokens: the units gathered, one layer's activations, logits.
    ``knob`` is the ``key=value`` that sets ``rows`` (a micro-batch), if any."""
    role, shape = planned.memory.role, planned.shape
    tokens = rows * length
    terms = _scoring_weights(planned) + [
        Term(f"{role} activations", role, "activations", tokens * shape.forward_width * shape.compute_bytes,
             f"{rows} rows x {length} tokens x (4 x {shape.hidden} + 3 x {shape.intermediate}{_moe(shape)}) x {shape.compute_bytes} B",
             knob)]
    if shape.causal:
        terms.append(_logits(role, shape, rows * (response + 1), knob))
    return terms


def _moe(shape: ModelShape) -> str:
    return f" ({shape.experts})" if shape.experts else ""


def _update_terms(planned: PlannedRole, rank: int, tokens: int, logit_tokens: int, checkpointing: bool,
                  knob: str = "") -> list[Term]:
    """One micro-batch's forward and backward: gradients, FSDP2's gathered units, activations, logits."""
    memory, shape, c = planned.memory, planned.shape, planned.shape.compute_bytes
    role, state = memory.role, memory.ranks[rank]
    where = f" / {memory.world_size} ranks" if memory.strategy == "fsdp2" and memory.world_size > 1 else ""
    terms = [Term(f"{role} gradients", role, "gradients", 0 if state.offloaded else state.grad_bytes,
                  f"{_count(memory.trainable_parameters)} trained x 4 B{where}" + (" (offloaded)" if state.offloaded else ""))]
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
                      f"{tokens} tokens x (6 x {shape.hidden} + 2 x {shape.kv_dim} + 4 x {shape.intermediate}{_moe(shape)}) x {c} B {how}",
                      knob))
    if shape.causal:
        terms.append(_logits(role, shape, logit_tokens, knob))
    return terms


def _count(number: int) -> str:
    for suffix, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if number >= size:
            return f"{number / size:.2f}{suffix}"
    return str(number)


@dataclass(frozen=True)
class _Engine:
    """The rollout engine's presence in the generating role's process: awake in the rollout, and outside it."""

    rollout: tuple[Term, ...]
    between: tuple[Term, ...]


def _vllm_engine(recipe: Recipe, holder: PlannedRole, use_gpu: bool, device_memory: int | None) -> _Engine:
    """vLLM's share while awake (``gpu_memory_utilization`` x the device) and its residue asleep; on CPU its weights + KV.
    ``holder`` is the generating role; the rollout group's engine never sleeps (its pool trains nothing)."""
    settings, role, shape = engine_settings(recipe.rollout.settings), holder.memory.role, engine_shape(recipe, holder.shape)
    t = int(settings["tensor_parallel_size"])
    if not use_gpu:
        weights = math.ceil(served_parameters(holder) / t) * shape.compute_bytes
        kv = int(float(settings["cpu_kv_cache_gib"]) * GIB)
        shard = f" / tensor_parallel_size {t}" if t > 1 else ""
        term = Term("vLLM engine", role, "engine", weights + kv,
                    f"weights {_count(served_parameters(holder))} x {shape.compute_bytes} B{shard} + rollout.vllm.cpu_kv_cache_gib {settings['cpu_kv_cache_gib']}")
        return _Engine((term,), (term,))
    share = float(settings["gpu_memory_utilization"])
    never = "; always awake (its pool trains nothing)" if role == ROLLOUT_ROLE else ""
    shard = f" (weights / tensor_parallel_size {t})" if t > 1 else ""
    awake = Term("vLLM engine (awake)", role, "engine", None if device_memory is None else int(share * device_memory),
                 f"rollout.vllm.gpu_memory_utilization {share:g} x device {_gib(device_memory)}: weights{shard}, KV cache, activations{never}")
    if not settings["enable_sleep_mode"] or role == ROLLOUT_ROLE:
        return _Engine((awake,), (awake,))
    asleep = Term("vLLM engine (asleep)", role, "residue", VLLM_ASLEEP_BYTES,
                  "sleep level 2 frees weights and KV cache; CUDA graphs and NCCL buffers stay")
    return _Engine((awake,), (asleep,))


@dataclass(frozen=True)
class EngineFit:
    """Whether a vLLM engine's weights (one tensor-parallel shard) and the KV cache of one sequence fit in its share
    of the device, with the same sum for every tensor-parallel size the pool and the model allow."""

    role: str
    tensor_parallel_size: int
    weights: int  # bytes per rank: parameters / t in compute dtype
    kv_cache: int  # bytes per rank: one sequence of prompt + response tokens
    tokens: int
    share: float  # rollout.vllm.gpu_memory_utilization
    device: int
    options: tuple[tuple[int, int], ...]  # (t, weights + one sequence's KV per rank) for each t allowed, ascending
    formula: str

    @property
    def needed(self) -> int:
        """Bytes the engine cannot start without: its weight shard and one sequence's KV cache."""
        return self.weights + self.kv_cache

    @property
    def budget(self) -> int:
        """The engine's share of the device: ``gpu_memory_utilization`` x the device."""
        return int(self.share * self.device)

    @property
    def fits(self) -> bool:
        """True when the weights and one sequence's KV cache fit in the share."""
        return self.needed <= self.budget

    def smallest_fitting(self, budget: int | None = None) -> int | None:
        """The smallest allowed tensor-parallel size whose weights and one sequence's KV fit ``budget`` (the share)."""
        limit = self.budget if budget is None else budget
        return next((t for t, needed in self.options if needed <= limit), None)


def served_parameters(holder: PlannedRole) -> int:
    """Parameters a vLLM engine holds for the generating role: its model's, less a LoRA adapter (the engine gets the
    adapter merged into the base weights)."""
    memory = holder.memory
    lora = memory.trainable and 0 < memory.trainable_parameters < memory.parameters
    return holder.shape.parameters - (memory.trainable_parameters if lora else 0)


def _engine_bytes(shape: ModelShape, parameters: int, t: int, tokens: int) -> tuple[int, int]:
    """(weights, one sequence's KV cache) per rank of an engine at tensor parallel ``t``: parameters / t in compute
    dtype; 2 (keys, values) x layers x KV heads per rank x head dim x tokens x compute bytes."""
    weights = math.ceil(parameters / t) * shape.compute_bytes
    kv = 2 * shape.layers * shape.kv_heads_per_rank(t) * shape.head_dim * tokens * shape.compute_bytes
    return weights, kv


def _tensor_parallel_options(shape: ModelShape, nodes: tuple[int, ...]) -> list[int]:
    """Tensor-parallel sizes an engine may take: dividing the ranks of every node (one engine stays on one node) and
    passing vLLM's sharding rules (:func:`rlhfctl.recipe.check_tensor_parallel.shard_problems`, their one home)."""
    fields = {"num_attention_heads": shape.attention_heads, "num_key_value_heads": shape.kv_heads,
              "intermediate_size": shape.intermediate_size or None}
    return [t for t in range(1, min(nodes) + 1)
            if all(ranks % t == 0 for ranks in nodes) and not shard_problems(t, fields, shape.vocab)]


def engine_fit(recipe: Recipe, holder: PlannedRole, nodes: tuple[int, ...], device_memory: int) -> EngineFit:
    """The vLLM engine of the generating role ``holder``, on a pool of ``nodes`` ranks per node, against its share of
    a ``device_memory`` device."""
    settings, shape, served = engine_settings(recipe.rollout.settings), engine_shape(recipe, holder.shape), served_parameters(holder)
    t, tokens = int(settings["tensor_parallel_size"]), sequence_length(recipe)
    weights, kv = _engine_bytes(shape, served, t, tokens)
    options = tuple((size, sum(_engine_bytes(shape, served, size, tokens)))
                    for size in _tensor_parallel_options(shape, nodes))
    formula = (f"weights {_count(served)} params x {shape.compute_bytes} B / tensor_parallel_size {t} + KV of one "
               f"sequence: 2 x {shape.layers} layers x {shape.kv_heads_per_rank(t)} KV heads per rank "
               f"(max(1, {shape.kv_heads} / {t})) x head dim {shape.head_dim} x {tokens} tokens x {shape.compute_bytes} B")
    return EngineFit(holder.memory.role, t, weights, kv, tokens, float(settings["gpu_memory_utilization"]), device_memory,
                     options, formula)


def _hf_rollout(recipe: Recipe, holder: PlannedRole, rank: int) -> tuple[Term, ...]:
    """The hf sampler of the generating role (the actor, or a rollout rank's replica): the whole model gathered (fsdp2;
    not with the actor's copy in ``rollout.dtype``, see :func:`_hf_copy`), the KV cache, the prefill's activations,
    the step's logits, in ``rollout.dtype``."""
    role, shape = holder.memory.role, engine_shape(recipe, holder.shape)
    rows = generation_rows(recipe, holder.memory.world_size)
    prompt, length = int(recipe.data.max_prompt_length), sequence_length(recipe)
    kv = holder.memory.ranks[rank].kv_cache_bytes
    prefill = rows * prompt * shape.forward_width * shape.compute_bytes
    sampling = rows * shape.vocab * _FP32 * LOGIT_FP32_COPIES
    gathered = [] if _hf_copy(recipe, holder) is not None else _gathered_weights(holder)
    return tuple(gathered) + (
        Term(f"{role} KV cache", role, "kv_cache", kv,
             f"{rows} rows x {length} tokens x {shape.layers} layers x KV width {shape.kv_dim} x 2 x {shape.compute_bytes} B"),
        Term(f"{role} activations", role, "activations", prefill,
             f"prefill {rows} rows x {prompt} tokens x (4 x {shape.hidden} + 3 x {shape.intermediate}) x {shape.compute_bytes} B"),
        Term(f"{role} logits", role, "logits", sampling, f"{rows} rows x vocab {shape.vocab} x 4 B x {LOGIT_FP32_COPIES} copies per step"),
    )


def _hf_copy(recipe: Recipe, holder: PlannedRole) -> _Engine | None:
    """The colocated hf engine's copy of the actor's model in ``rollout.dtype`` apart from the actor's
    (``rlhfctl/rollout/precision_replica.py``): a whole replica on every rank, kept between rollouts; else None."""
    if holder.memory.role == ROLLOUT_ROLE or rollout_engine(recipe) != "hf" or not recipe.rollout.own_precision:
        return None
    served, c = served_parameters(holder), dtype_bytes(recipe.rollout.dtype)
    term = Term(f"{holder.memory.role} rollout copy", holder.memory.role, "engine", served * c,
                f"{_count(served)} params x {c} B: the hf engine's whole copy in rollout.dtype {recipe.rollout.dtype}")
    return _Engine((term,), (term,))


def _sync_bucket(recipe: Recipe, shape: ModelShape) -> tuple[int, str]:
    """Bytes of one weight-sync bucket in ``shape``'s dtype (the engine's), and its formula: ``rollout.vllm.sync_bucket_mib``, or the
    largest tensor when that is larger (a bucket holds whole tensors), at most the whole model."""
    mib, c = float(engine_settings(recipe.rollout.settings)["sync_bucket_mib"]), shape.compute_bytes
    size = min(shape.parameters * c, max(int(mib * 2**20), shape.largest_tensor * c))
    return size, (f"max(rollout.vllm.sync_bucket_mib {mib:g} MiB, largest tensor {_count(shape.largest_tensor)} x {c} B), "
                  f"at most the whole model ({_count(shape.parameters)} x {c} B)")


def _send_terms(recipe: Recipe, actor: PlannedRole, rank: int) -> list[Term]:
    """The actor's end of a sync: every rank gathers (fsdp2) or casts one bucket at a time in rollout.dtype, never the
    whole model; rank 0 also packs it into the byte buffer it broadcasts to the rollout ranks."""
    size, rule = _sync_bucket(recipe, engine_shape(recipe, actor.shape))  # cast to rollout.dtype
    how = ("FSDP2 all-gathers a bucket at a time, never the whole model" if actor.memory.strategy == "fsdp2"
           else "cast to rollout.dtype a bucket at a time")
    terms = [Term("actor send bucket (gathered)", "actor", "sync", size, f"{rule}; {how}")]
    if rank == 0:
        terms.append(Term("actor send buffer (packed)", "actor", "sync", size,
                          f"{rule}; rank 0 packs the bucket into one byte buffer and broadcasts it"))
    return terms


def _receive_terms(recipe: Recipe, rollout: PlannedRole) -> list[Term]:
    """A rollout rank's end of a sync: one received bucket as a byte buffer, alive until the next one arrives."""
    size, rule = _sync_bucket(recipe, rollout.shape)
    return [Term(f"{ROLLOUT_ROLE} received bucket", ROLLOUT_ROLE, "sync", size,
                 f"{rule}; one byte buffer, copied into the model or the engine before the next")]


# ------------------------------------------------------------------ the calls of a step, per process


def _update_call(recipe: Recipe, planned: PlannedRole, rank: int, rows: int, length: int, response: int) -> list[Term]:
    """An update's micro-batch: ``micro_batch_tokens`` tokens, or ``micro_batch_size`` (else a mini-batch's) rows."""
    settings = recipe.roles[planned.memory.role].settings  # the reward role (reward_model) has no mini-batch keys: None
    budget = settings.get("micro_batch_tokens")
    micro = settings.get("micro_batch_size") or samples_per_rank(
        settings.get("mini_batch_size"), int(recipe.rollout.settings.n), planned.memory.world_size, rows)
    tokens, logit_tokens = (int(budget), int(budget)) if budget else (micro * length, micro * (response + 1))
    checkpointing = bool(planned.spec.model.gradient_checkpointing)
    role = planned.memory.role  # a token budget holds one whole sequence at least
    knob = f"roles.{role}.micro_batch_tokens={budget},{length}" if budget else f"roles.{role}.micro_batch_size={micro}"
    return _update_terms(planned, rank, tokens, logit_tokens, checkpointing, knob)


def _ppo_calls(recipe: Recipe, roles: Mapping[str, PlannedRole], rank: int,
               engine: _Engine | None) -> list[tuple[str, str, list[Term]]]:
    """(call, group, its own terms) for the PPO step's calls of the roles in one process, in step order."""
    length, response = sequence_length(recipe), recipe.rollout.response_width
    rows = {role: math.ceil(samples_per_step(recipe) / planned.memory.world_size) for role, planned in roles.items()}
    micro = {role: recipe.roles[role].settings.get("micro_batch_size") for role in roles if role not in ("reward", ROLLOUT_ROLE)}
    calls = _generate_call(recipe, roles, rank, engine)
    if "reward" in roles:
        batch = recipe.roles["reward"].settings.batch_size or rows["reward"]  # null: the whole shard
        calls.append(("reward.compute_rewards", LOG_PROBS, _pass_terms(roles["reward"], min(batch, rows["reward"]), length, response)))
    for role, (method, _) in TOKEN_SCORING_ROLES.items():  # a teacher's log-probs, before the reference's
        if role in roles:
            calls.append((f"{role}.{method}", LOG_PROBS, _pass_terms(roles[role], rows[role], length, response)))
    if "reference" in roles:
        calls.append(("reference.compute_ref_log_prob", LOG_PROBS, _pass_terms(roles["reference"], rows["reference"], length, response)))
    elif "actor" in roles and recipe.step.reference_source == "actor":
        calls.append(("actor.compute_ref_log_prob", LOG_PROBS, _micro_pass(roles["actor"], micro, rows, length, response)))
    if "critic" in roles:
        calls.append(("critic.compute_values", LOG_PROBS, _micro_pass(roles["critic"], micro, rows, length, response)))
    if "actor" in roles and recipe.step.needs_old_log_probs:
        calls.append(("actor.compute_log_prob", LOG_PROBS, _micro_pass(roles["actor"], micro, rows, length, response)))
    for role, method in (("critic", "update_critic"), ("actor", "update_actor")):
        if role in roles:
            calls.append((f"{role}.{method}", UPDATE, _update_call(recipe, roles[role], rank, rows[role], length, response)))
    return calls + _sync_calls(recipe, roles, rank)


def _micro_pass(planned: PlannedRole, micro: Mapping[str, Any], rows: Mapping[str, int], length: int,
                response: int) -> list[Term]:
    """A scoring pass of a trained role: ``micro_batch_size`` rows at a time, else all of the rank's rows."""
    role = planned.memory.role
    size = micro[role] or rows[role]
    return _pass_terms(planned, size, length, response, f"roles.{role}.micro_batch_size={size}")


def _generate_call(recipe: Recipe, roles: Mapping[str, PlannedRole], rank: int,
                   engine: _Engine | None) -> list[tuple[str, str, list[Term]]]:
    """The rollout, where the generating role (:func:`generating_role`) is in this process: its engine's terms."""
    role = generating_role(recipe)
    if role not in roles:
        return []
    terms = list(engine.rollout) if engine else []
    if rollout_engine(recipe) != "vllm":  # the hf sampler, beside its copy in rollout.dtype when it has one
        terms += _hf_rollout(recipe, roles[role], rank)
    return [(f"{role}.generate_sequences", ROLLOUT, terms)]


def _sync_calls(recipe: Recipe, roles: Mapping[str, PlannedRole], rank: int) -> list[tuple[str, str, list[Term]]]:
    """The weight channel's two ends with ``rollout.placement: separate``: the actor's send after its update, and
    the rollout group's receive (queued behind the generations already sent)."""
    if generating_role(recipe) != ROLLOUT_ROLE:
        return []
    calls: list[tuple[str, str, list[Term]]] = []
    if "actor" in roles:
        calls.append(("actor.send_weights", SYNC, _send_terms(recipe, roles["actor"], rank)))
    if ROLLOUT_ROLE in roles:
        calls.append((f"{ROLLOUT_ROLE}.receive_weights", SYNC, _receive_terms(recipe, roles[ROLLOUT_ROLE])))
    return calls


def _stage_calls(recipe: Recipe, roles: Mapping[str, PlannedRole], rank: int) -> list[tuple[str, str, list[Term]]]:
    """A supervised stage's calls: dpo's reference pass, then the trained role's training step."""
    stage = stage_of(recipe)
    assert stage is not None
    length = int(recipe.data.max_length)
    pairs = 2 if stage.record_kind == "preferences" else 1
    calls: list[tuple[str, str, list[Term]]] = []
    for role, planned in roles.items():
        rows = math.ceil(int(recipe.trainer.batch_size) / planned.memory.world_size) * pairs
        if role == stage.trained_role:
            calls.append((f"{role}.{stage.methods[1]}", UPDATE, _update_call(recipe, planned, rank, rows, length, length - 1)))
        elif role == "reference":
            calls.insert(0, ("reference.compute_ref_log_prob", LOG_PROBS, _pass_terms(planned, rows, length, length - 1)))
    return calls


def pool_phases(recipe: Recipe, members: list[PlannedRole], use_gpu: bool, device_memory: int | None) -> list[Phase]:
    """Every call of every rank of one pool's processes: the colocated roles' state, the engine (in the pool of the
    generating role), the call's own terms."""
    roles = {planned.memory.role: planned for planned in members}
    stage = stage_of(recipe) is not None
    holder = roles.get(generating_role(recipe))
    engine = None
    if holder is not None and not stage and rollout_engine(recipe) == "vllm":
        engine = _vllm_engine(recipe, holder, use_gpu, device_memory)
    elif holder is not None and not stage:
        engine = _hf_copy(recipe, holder)
    context = [Term("CUDA context + NCCL", "", "context", CONTEXT_BYTES, "per process, outside torch's allocator")] if use_gpu else []
    phases = []
    for rank in range(max(planned.memory.world_size for planned in members)):
        calls = _stage_calls(recipe, roles, rank) if stage else _ppo_calls(recipe, roles, rank, engine)
        for call, group, own in calls:
            resident = [term for planned in members if rank < planned.memory.world_size
                        for term in _state_terms(planned, rank, call, group)]
            between = list(engine.between) if engine is not None and group != ROLLOUT else []
            phases.append(Phase(call, group, rank, tuple(context + resident + between + own)))
    return phases
