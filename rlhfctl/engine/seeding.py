"""Reproducible randomness: seeds derived from (seed, rank, counter) and RNG states for checkpoints."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["capture_rng_state", "derive_seed", "gather_rng_states", "generation_seed_parts", "make_generator",
           "restore_rng_state", "rng_state_for_rank", "seed_everything"]


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed that depends on every part (e.g. ``(trainer.seed, rank, call_counter)``)."""
    digest = hashlib.sha256(repr(tuple(parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def make_generator(device: torch.device | str, *parts: int | str) -> torch.Generator:
    """A torch.Generator on ``device`` seeded with :func:`derive_seed` of ``parts``."""
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(derive_seed(*parts))
    return generator


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch (CPU and CUDA) global generators."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def capture_rng_state() -> dict[str, Any]:
    """Global RNG states as tensors/ints only, so they load with ``torch.load(weights_only=True)``."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    python_version, python_state, python_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": int(python_version), "state": list(python_state), "gauss": python_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Undo :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"].cpu())
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    python_state = state["python"]
    random.setstate((python_state["version"], tuple(python_state["state"]), python_state["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def gather_rng_states() -> list[dict[str, Any]] | None:
    """Every rank's :func:`capture_rng_state`, in rank order, on rank 0 (None on the others).

    A collective under torch.distributed: every rank of the group must call it.
    """
    own = capture_rng_state()
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return [own]
    rank = dist.get_rank()
    gathered: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(own, gathered, dst=0)
    return gathered


def rng_state_for_rank(saved: dict[str, Any], rank: int) -> dict[str, Any] | None:
    """The RNG state ``rank`` restores from a saved worker state, or None to keep its own fresh seed.

    ``saved["rank_rng"]`` holds one state per saving rank: rank r restores entry r. A rank the saving run
    did not have (a resume on more ranks), or any rank above 0 of a checkpoint written before per-rank
    states were kept (only rank 0's ``saved["rng"]``), keeps the state it was seeded with at start-up,
    ``(trainer.seed, rank, role)``: distinct per rank, never a copy of another rank's stream.
    """
    per_rank = saved.get("rank_rng")
    if per_rank is not None:
        return per_rank[rank] if rank < len(per_rank) else None
    return saved.get("rng") if rank == 0 else None


def generation_seed_parts(seed: int, rank: int, meta_info: Mapping[str, Any]) -> tuple[Any, ...]:
    """The parts that seed one generation call: the draw (and chunk) the driver numbered, so a step's samples
    do not depend on which process generates them (the colocated actor and a rollout group draw alike, one chunk
    a draw) nor on what else ran there since a checkpoint."""
    draw = int(meta_info.get("draw", 0))
    chunks = int(meta_info.get("chunks", 1))
    if chunks == 1:
        return (seed, rank, "generate", draw)
    return (seed, rank, "generate", draw, int(meta_info.get("chunk", 0)))
