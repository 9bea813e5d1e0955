"""What cannot fit in the memory plan, and what to change: a call above the device or a vLLM engine above its share
(validate's errors, exit 2), a call above :data:`TIGHT_SHARE` of the device (a warning), each with its largest terms
and the settings that would make it fit, with values (:mod:`rlhfctl.recipe.memory_plan` builds the plan)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlhfctl.recipe.memory_calls import ROLLOUT, UPDATE, EngineFit, Phase, Term
from rlhfctl.recipe.memory_state import RoleMemory
from rlhfctl.recipe.resolve import ROLLOUT_ROLE

if TYPE_CHECKING:  # for annotations only: memory_plan imports this module, never the other way at run time
    from rlhfctl.recipe.memory_plan import MemoryPlan

__all__ = ["TIGHT_SHARE", "Misfit", "refusals", "tight_calls"]

GIB = 2**30
#: Above this share of the device a call is a warning: the plan is an estimate, and the caching allocator's
#: fragmentation needs some room. Above the whole device it is an error.
TIGHT_SHARE = 0.9


@dataclass(frozen=True)
class Misfit:
    """A call whose process needs more than the device has (or more than :data:`TIGHT_SHARE` of it), or a vLLM engine
    whose weights and one sequence's KV cache exceed its share; its largest terms and the knobs that would help most."""

    pool: str
    call: str
    needed: int
    device: int  # the limit: the device's memory, or the engine's share of it
    knobs: tuple[str, ...]
    key_path: str = ""
    largest: tuple[str, ...] = ()  # "name size" of the largest terms
    limit: str = ""  # what ``device`` is when it is the engine's share, not the device

    @property
    def fits(self) -> bool:
        """True for a call within the device (a tight one, above :data:`TIGHT_SHARE`): a warning, not an error."""
        return self.needed <= self.device

    @property
    def message(self) -> str:
        """One line: what does not fit, by how much, its largest terms and what to change, with values."""
        needed, device = f"{self.needed / GIB:.1f} GiB", f"{self.device / GIB:.1f} GiB"
        share = f"{100 * self.needed / self.device:.0f}%"
        if self.limit:
            head = f"pool {self.pool}'s vLLM engine ({self.call}) needs {needed} per rank, more than {self.limit} ({device})"
        elif self.fits:
            head = (f"pool {self.pool} needs {needed} in {self.call}, {share} of the device's {device} (above "
                    f"{100 * TIGHT_SHARE:.0f}%: little room for the allocator)")
        else:
            head = (f"pool {self.pool} needs {needed} in {self.call}, {share} of the device's {device} "
                    f"({(self.needed - self.device) / GIB:.1f} GiB over)")
        terms = f"; largest terms: {', '.join(self.largest)}" if self.largest else ""
        return f"memory plan: {head}{terms}; try {'; or '.join(self.knobs)}"


def refusals(plan: "MemoryPlan") -> list[Misfit]:
    """What cannot fit (an error): each vLLM engine whose weights and one sequence's KV cache exceed its share,
    and each pool's calls that need more than the device (largest rank); with the knobs that help."""
    engines = [_engine_misfit(plan, pool, engine) for pool, engine in plan.engines.items() if not engine.fits]
    return engines + [misfit for misfit in _calls_above(plan, TIGHT_SHARE) if not misfit.fits]


def tight_calls(plan: "MemoryPlan") -> list[Misfit]:
    """Calls between :data:`TIGHT_SHARE` and all of the device (a warning), with the knobs that make room."""
    return [misfit for misfit in _calls_above(plan, TIGHT_SHARE) if misfit.fits]


def _calls_above(plan: "MemoryPlan", share: float) -> list[Misfit]:
    """Each pool's calls (their largest rank) above ``share`` of the device; the knobs aim at the device for a
    call over it, at ``share`` for one under it."""
    if not plan.device_memory:
        return []
    found = []
    for pool in plan.phases:
        worst: dict[str, Phase] = {}
        for phase in plan.phases[pool]:
            if phase.call not in worst or phase.total > worst[phase.call].total:
                worst[phase.call] = phase
        for phase in worst.values():
            if phase.total <= share * plan.device_memory:
                continue
            target = plan.device_memory if phase.total > plan.device_memory else int(share * plan.device_memory)
            largest = sorted((term for term in phase.terms if term.bytes), key=lambda term: -(term.bytes or 0))[:3]
            found.append(Misfit(pool, phase.call, phase.total, plan.device_memory,
                                _knobs(phase, phase.total - target, plan, pool), f"resource_pools.{pool}",
                                tuple(f"{term.name} {(term.bytes or 0) / GIB:.1f} GiB" for term in largest)))
    return found


def _knobs(phase: Phase, over: int, plan: "MemoryPlan", pool: str) -> tuple[str, ...]:
    """The settings that shrink this call by ``over`` bytes, with values, the ones acting on the most bytes first (at
    most four)."""
    acting: dict[str, int] = {}
    pairs = _batch_knobs(phase, over) + [pair for term in phase.terms for pair in _knobs_for(term, phase, over, plan, pool)]
    for knob, size in pairs:
        acting[knob] = acting.get(knob, 0) + size
    ranked = sorted(acting.items(), key=lambda item: -item[1])
    return tuple(f"{knob} (acts on {size / GIB:.1f} GiB)" for knob, size in ranked[:4]) or ("more ranks",)


def _batch_knobs(phase: Phase, over: int) -> list[tuple[str, int]]:
    """A micro-batch setting (``key=value`` on the terms that grow with it) with the value that takes ``over`` bytes off."""
    growing: dict[str, int] = {}
    for term in phase.terms:
        if term.scales_with and term.bytes:
            growing[term.scales_with] = growing.get(term.scales_with, 0) + term.bytes
    knobs = []
    for setting, size in growing.items():
        key, values = setting.split("=")
        now, _, least = values.partition(",")
        value, floor = (math.floor(int(now) * (size - over) / size) if size > over else 0), int(least or 1)
        if int(now) > floor:
            alone = "" if value >= floor else ", not enough alone"
            knobs.append((f"{key} {max(floor, value)} (now {now}{alone})", size))
    return knobs


def _knobs_for(term: Term, phase: Phase, over: int, plan: "MemoryPlan", pool: str) -> list[tuple[str, int]]:
    """What shrinks one term, and the bytes it acts on: vLLM's share (with the value that fits), offload between calls
    or more ranks for state, a smaller sync bucket; the rollout group's terms have the rollout's own knobs."""
    role = next((item for item in plan.roles if item.role == term.role), None)
    size = term.bytes or 0
    if not size or role is None and term.kind != "engine":
        return []
    ranks = f"more ranks (resource_pools.{role.pool}.process_on_nodes, now {role.world_size})" if role else ""
    if term.kind == "engine":
        return [(_share_knob(plan, pool, term, over), size)]
    if term.kind == "sync":
        return [("a smaller rollout.vllm.sync_bucket_mib", size)]
    if term.role == ROLLOUT_ROLE:
        return [(knob, size) for knob in _rollout_knobs(term, ranks)]
    if term.kind == "state":
        return [(_offload_knob(term, phase, role), size), (ranks, size)]
    if term.kind == "gradients":
        return [(f"roles.{term.role}.fsdp.cpu_offload: true (the slow choice: AdamW on the host)", size), (ranks, size)]
    if term.kind in ("activations", "logits") and not term.scales_with:
        return [(ranks, size)]
    if term.kind == "kv_cache":
        return [(ranks, size), ("rollout.engine: vllm", size)]
    if term.kind == "unshard" and phase.group == ROLLOUT:
        return [("rollout.engine: vllm", size)]
    return []


def _offload_knob(term: Term, phase: Phase, role: RoleMemory) -> str:
    """Offload between calls where it frees this term during this call; else the always-offloaded (slow) choice."""
    own = phase.call.split(".", 1)[0] == role.role
    if term.name.endswith(" optimizer") and not (own and phase.group == UPDATE) and not role.optimizer_offload:
        return f"roles.{role.role}.fsdp.optimizer_offload: true"
    if term.name.endswith(" weights") and not own and not role.param_offload:
        return f"roles.{role.role}.fsdp.param_offload: true"
    return f"roles.{role.role}.fsdp.cpu_offload: true (the slow choice: AdamW on the host)"


def _share_knob(plan: "MemoryPlan", pool: str, term: Term, over: int) -> str:
    """A lower ``gpu_memory_utilization`` that fits the call, with the tensor-parallel size its engine then needs."""
    device = plan.device_memory or 1
    fits = math.floor(100 * ((term.bytes or 0) - over) / device) / 100
    if fits <= 0:
        return "a lower rollout.vllm.gpu_memory_utilization"
    knob = f"rollout.vllm.gpu_memory_utilization {fits:.2f} (now {(term.bytes or 0) / device:.2f})"
    engine = plan.engines.get(pool)
    if engine is None or engine.needed <= fits * device:
        return knob
    t = engine.smallest_fitting(int(fits * device))
    return f"{knob} with rollout.vllm.tensor_parallel_size {t}" if t else f"{knob}, too little for its weights at any tensor_parallel_size"


def _rollout_knobs(term: Term, ranks: str) -> list[str]:
    """The rollout group's hf terms: its replica shrinks only with vLLM (which frees it and works within its share);
    the KV cache, activations and logits also with more rollout ranks (fewer rows each)."""
    if term.kind == "state":
        return ["rollout.engine: vllm"]
    return [ranks, "rollout.engine: vllm"] if term.kind in ("kv_cache", "activations", "logits") else []


def _engine_misfit(plan: "MemoryPlan", pool: str, engine: EngineFit) -> Misfit:
    """The engine's weights per rank and one sequence's KV cache against its share, with the settings that fit it."""
    device = plan.device_memory or engine.device
    knobs = []
    t = engine.smallest_fitting()
    if t is not None:
        size = dict(engine.options)[t]
        knobs.append(f"rollout.vllm.tensor_parallel_size {t} (now {engine.tensor_parallel_size}; weights and one "
                     f"sequence's KV cache then {size / GIB:.1f} GiB per rank)")
    elif engine.options:
        largest, size = engine.options[-1]
        knobs.append(f"no rollout.vllm.tensor_parallel_size the pool's nodes and the model's heads allow fits alone "
                     f"(at {largest}: {size / GIB:.1f} GiB per rank)")
    share = math.ceil(100 * engine.needed / device) / 100
    rollout = max((phase.total for phase in plan.phases.get(pool, []) if phase.group == ROLLOUT), default=0)
    if share < 1 and rollout - engine.budget + share * device <= device:
        knobs.append(f"rollout.vllm.gpu_memory_utilization {share:.2f} (now {engine.share:g})")
    if engine.weights < engine.budget < engine.needed:
        knobs.append(f"fewer tokens per sequence (data.max_prompt_length + rollout.max_new_tokens, now {engine.tokens})")
    largest = (f"weights {engine.weights / GIB:.1f} GiB (1/{engine.tensor_parallel_size} of the model)",
               f"KV cache of one sequence {engine.kv_cache / GIB:.2f} GiB ({engine.tokens} tokens)")
    return Misfit(pool, f"{engine.role}.generate_sequences", engine.needed, engine.budget, tuple(knobs) or ("more memory",),
                  "rollout.vllm.tensor_parallel_size", largest,
                  f"its share: rollout.vllm.gpu_memory_utilization {engine.share:g} x {device / GIB:.1f} GiB")
