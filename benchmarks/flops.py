"""Model-FLOPs utilization for the benchmarks: a matmul peak measured in the same run, and phase shares of it.

The work of a phase is counted the usual way: about ``6 x parameters x tokens`` for an update (forward and
backward) and ``2 x parameters x tokens`` for generation (one forward per generated token). Tokens are the
real ones (pad positions are not useful work). A share is that work per second over the peak.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

UPDATE_FLOPS_PER_PARAM_TOKEN = 6
GENERATE_FLOPS_PER_PARAM_TOKEN = 2


def matmul_peak(size: int = 2048, repeats: int = 5, device: str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """Best FLOP/s of a square matmul on this process's threads (or one CUDA device): the run's own ceiling."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        torch.mm(a, b)
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def model_parameters(model_cfg: Mapping[str, Any]) -> int:
    """Parameters of a recipe's causal LM (inline ``config``), counted on the meta device: no weights made."""
    from rlhfctl.models.loading import load_causal_lm, load_tokenizer

    with torch.device("meta"):
        model = load_causal_lm(dict(model_cfg), load_tokenizer(dict(model_cfg)))
    return sum(parameter.numel() for parameter in model.parameters())


def phase_share(flops_per_param_token: int, parameters: int, tokens: float, seconds: float, peak: float) -> float:
    """Achieved FLOP/s of a phase (``factor x parameters x tokens`` in ``seconds``) as a share of ``peak``."""
    return flops_per_param_token * parameters * tokens / seconds / peak if seconds > 0 and peak > 0 else float("nan")


def shares(parameters: int, peak: float, *, update: tuple[float, float] | None = None,
           generate: tuple[float, float] | None = None) -> dict[str, float]:
    """``mfu/update`` and ``mfu/generate`` from (tokens, seconds) of each phase measured."""
    out: dict[str, float] = {}
    if update is not None:
        out["mfu/update"] = phase_share(UPDATE_FLOPS_PER_PARAM_TOKEN, parameters, *update, peak)
    if generate is not None:
        out["mfu/generate"] = phase_share(GENERATE_FLOPS_PER_PARAM_TOKEN, parameters, *generate, peak)
    return out


def percent(share: float | None) -> str:
    """A share as a percentage cell ("-" when it was not measured)."""
    return "-" if share is None or share != share else f"{100 * share:.1f}%"
