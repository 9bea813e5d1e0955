"""Save and load one trainable role's state: weights (safetensors, or the LoRA adapter alone),
optimizer and scheduler state, RNG states and the worker's counters.

Layout of ``<directory>/<role>/``::

    model.safetensors          full weights (safetensors.torch.save_model; tied weights handled)
    adapter/                   instead, with LoRA: adapter_config.json + adapter_model.safetensors
    optimizer.pt               optimizer.state_dict()
    scheduler.pt               scheduler.state_dict()
    worker_state.pt            {"rng": rank 0's RNG, "rank_rng": [every rank's RNG], "counters": {...}}
    checkpoint.json            what wrote it (role, worker class, lora or not)

Every ``.pt`` file loads with ``torch.load(..., weights_only=True)``. A role directory is written
to a temporary sibling and renamed, so an interrupted save never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from workers.lora import is_lora, load_adapter, save_adapter
from workers.seeding import capture_rng_state, restore_rng_state, rng_state_for_rank

__all__ = ["ADAPTER_DIR", "MODEL_FILE", "load_role_state", "role_directory", "save_role_state"]

MODEL_FILE = "model.safetensors"
ADAPTER_DIR = "adapter"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
WORKER_STATE_FILE = "worker_state.pt"
INFO_FILE = "checkpoint.json"


def role_directory(directory: str | os.PathLike[str], role: str) -> Path:
    """``<directory>/<role>``, with ``~`` expanded."""
    return Path(os.path.expanduser(str(directory))) / role


def save_role_state(
    target: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    counters: dict[str, int],
    info: dict[str, Any],
    rank_rng: list[dict[str, Any]] | None = None,
) -> Path:
    """Write the role's state to ``target`` (replacing what was there); returns ``target``.

    ``rank_rng`` holds every rank's RNG state in rank order (:func:`workers.seeding.gather_rng_states`);
    without it, only this process's state is saved.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        lora = is_lora(model)
        if lora:
            save_adapter(model, staging / ADAPTER_DIR)
        else:
            save_model(model, str(staging / MODEL_FILE))
        torch.save(optimizer.state_dict(), staging / OPTIMIZER_FILE)
        torch.save(scheduler.state_dict(), staging / SCHEDULER_FILE)
        rank_rng = rank_rng or [capture_rng_state()]
        torch.save({"rng": rank_rng[0], "rank_rng": rank_rng, "counters": dict(counters)}, staging / WORKER_STATE_FILE)
        (staging / INFO_FILE).write_text(json.dumps({**info, "lora": lora, "format": 1}, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _load(path: Path, device: torch.device | str = "cpu") -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {path} is missing")
    return torch.load(path, map_location=device, weights_only=True)


def load_role_state(
    source: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    device: torch.device,
    rank: int = 0,
) -> dict[str, int]:
    """Restore what :func:`save_role_state` wrote into the given objects, with ``rank``'s own RNG state
    (see :func:`workers.seeding.rng_state_for_rank` for a resume on a different number of ranks);
    returns the counters."""
    if not source.is_dir():
        raise FileNotFoundError(f"no checkpoint for this role at {source}")
    lora = is_lora(model)
    if lora:
        if not (source / ADAPTER_DIR).is_dir():
            raise FileNotFoundError(f"{source} holds no LoRA adapter ({ADAPTER_DIR}/), but the model has one")
        load_adapter(model, source / ADAPTER_DIR, device)
    else:
        if not (source / MODEL_FILE).is_file():
            raise FileNotFoundError(f"{source} holds no {MODEL_FILE} (was it saved from a LoRA model?)")
        missing, unexpected = load_model(model, str(source / MODEL_FILE), strict=False, device=str(device))
        if missing or unexpected:
            raise RuntimeError(
                f"{source / MODEL_FILE} does not match the model: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
    optimizer.load_state_dict(_load(source / OPTIMIZER_FILE))
    scheduler.load_state_dict(_load(source / SCHEDULER_FILE))
    state = _load(source / WORKER_STATE_FILE)
    rng = rng_state_for_rank(state, rank)
    if rng is not None:
        restore_rng_state(rng)
    return {key: int(value) for key, value in state.get("counters", {}).items()}
