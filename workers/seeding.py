"""Reproducible randomness: seeds derived from (seed, rank, counter) and RNG states for checkpoints."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "derive_seed", "make_generator", "restore_rng_state", "seed_everything"]


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
