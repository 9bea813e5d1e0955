"""Optimisation plumbing shared by the trainable roles: optimizer, LR schedule, and the
epoch / mini-batch / micro-batch loop with gradient accumulation and clipping.

One optimizer step per mini-batch; gradients of its micro-batches are accumulated (each loss scaled by
its share of the mini-batch's rows or loss tokens, ``rlhfctl.engine.micro_batches``) and, under DDP, all-reduced
only on the last micro-batch (FSDP2 reduce-scatters every micro-batch into the float32 gradient shards).
Clipping uses the global norm over every shard (``rlhfctl.engine.placement.clip_grad_norm``). The LR
scheduler is stepped by the worker once per update call, so ``trainer.total_steps`` is its horizon.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlhfctl.models.loading import enable_activation_checkpointing  # the workers' checkpointing switch
from rlhfctl.single_controller import rank_progress
from rlhfctl.engine.placement import clip_grad_norm
from rlhfctl.engine.micro_batches import micro_batch_shares, split_by_rows, split_by_tokens

__all__ = [
    "LRSchedule",
    "allreduce_mean",
    "build_optimizer",
    "build_scheduler",
    "check_same_across_ranks",
    "distributed",
    "enable_activation_checkpointing",
    "optimize_on_batch",
    "trainable_parameters",
    "unwrap",
]

SCHEDULES = ("constant", "linear", "cosine")
LossFn = Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, Mapping[str, Any]]]


class LRSchedule:
    """LR multiplier for ``LambdaLR``: linear warmup, then constant, linear or cosine decay to
    ``min_lr_ratio`` at ``total_steps``. A plain object, so its state loads with weights_only."""

    def __init__(self, kind: str, warmup_steps: int, total_steps: int | None, min_lr_ratio: float) -> None:
        if kind not in SCHEDULES:
            raise ValueError(f"unknown lr_schedule {kind!r}; choose one of: {', '.join(SCHEDULES)}")
        if kind != "constant" and not total_steps:
            raise ValueError(f"lr_schedule {kind!r} needs trainer.total_steps (the number of update calls)")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.kind = kind
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps or 0)
        self.min_lr_ratio = float(min_lr_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if self.kind == "linear":
            decay = 1.0 - progress
        else:
            decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * decay


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters with ``requires_grad`` (the LoRA adapter only, for a peft model)."""
    return [parameter for parameter in model.parameters() if parameter.requires_grad]


def build_optimizer(model: nn.Module, optim: Mapping[str, Any]) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters from ``roles.<role>.optim`` (the fused kernel where it runs)."""
    params = trainable_parameters(model)
    if not params:
        raise ValueError("the model has no trainable parameters")
    betas = tuple(float(beta) for beta in optim["betas"])
    if len(betas) != 2:
        raise ValueError(f"optim.betas must hold two numbers, got {optim['betas']!r}")
    # The fused kernel (one per parameter instead of a dozen ops each) is what transformers' Trainer uses
    # too; it takes floating-point parameters on CPU or CUDA.
    fused = all(param.is_floating_point() and param.device.type in ("cpu", "cuda") for param in params)
    return torch.optim.AdamW(
        params, lr=float(optim["lr"]), betas=betas, eps=float(optim["eps"]), weight_decay=float(optim["weight_decay"]),
        fused=fused or None,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, optim: Mapping[str, Any], total_steps: int | None
) -> torch.optim.lr_scheduler.LambdaLR:
    """The ``lr_schedule`` of ``roles.<role>.optim`` over ``total_steps`` update calls."""
    schedule = LRSchedule(
        str(optim["lr_schedule"]), int(optim["warmup_steps"]), total_steps, float(optim["min_lr_ratio"])
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def distributed() -> bool:
    """True inside an initialised torch.distributed group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _accumulating(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    if isinstance(model, nn.parallel.DistributedDataParallel) and not sync:
        return model.no_sync()
    return contextlib.nullcontext()


def allreduce_mean(metrics: Mapping[str, float], device: torch.device) -> dict[str, float]:
    """Average float metrics over the ranks, so every rank returns the same dict."""
    keys = sorted(metrics)
    if not distributed() or not keys:
        return {key: float(metrics[key]) for key in keys}
    values = torch.tensor([float(metrics[key]) for key in keys], dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    values /= dist.get_world_size()
    return dict(zip(keys, values.tolist()))


def check_same_across_ranks(value: int, what: str, device: torch.device) -> None:
    """Raise (on every rank) when ranks disagree on ``value``: DDP would otherwise hang."""
    if not distributed():
        return
    local = torch.tensor([value], dtype=torch.int64, device=device)
    gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    seen = [int(item.item()) for item in gathered]
    if len(set(seen)) > 1:
        raise ValueError(f"ranks disagree on {what}: {seen}; every rank must train on the same number of rows")


def _mini_batches(rows: int, size: int, epochs: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    for _ in range(epochs):
        order = torch.randperm(rows, generator=generator)
        yield from order.split(size)


def _micro_batches_per_epoch(rows: int, mini: int, micro: int) -> int:
    """Micro-batches in one pass: each mini-batch (the last may be short) split into pieces of ``micro`` rows."""
    full, rest = divmod(rows, mini)
    return full * math.ceil(mini / micro) + (math.ceil(rest / micro) if rest else 0)


def optimize_on_batch(
    batch: Mapping[str, torch.Tensor],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    device: torch.device,
    epochs: int,
    mini_batch_rows: int,
    micro_batch_rows: int | None,
    grad_clip: float | None,
    generator: torch.Generator,
    micro_batch_tokens: int | None = None,
    row_tokens: torch.Tensor | None = None,
    loss_tokens: torch.Tensor | None = None,
    budget_key: str = "micro_batch_tokens",
    after_step: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Run ``epochs`` passes of shuffled mini-batches; returns the loss metrics and ``grad_norm``
    averaged over mini-batches (each mini-batch's metrics weighted as its micro-batches' losses).

    ``loss_fn(micro_batch)`` returns ``(loss, metrics)`` for tensors already on ``device``, the loss a
    mean over the micro-batch's rows, or over its loss tokens when ``loss_tokens`` (per row) is given;
    ``model`` is the module the loss runs through (DDP-wrapped, FSDP2-sharded or plain). With ``micro_batch_tokens``,
    micro-batches hold at most that many ``row_tokens`` (per row) instead of ``micro_batch_rows`` rows
    (``budget_key`` names the setting in errors). ``after_step`` runs after each optimizer step, while
    the gradients still exist.
    """
    rows = next(iter(batch.values())).shape[0]
    mini = max(1, min(int(mini_batch_rows), rows))
    micro = mini if not micro_batch_rows else max(1, min(int(micro_batch_rows), mini))
    params = trainable_parameters(model)
    max_norm = float(grad_clip) if grad_clip and grad_clip > 0 else float("inf")
    totals: dict[str, float] = defaultdict(float)
    steps = done = 0
    total = max(1, int(epochs)) * _micro_batches_per_epoch(rows, mini, micro)
    for indices in _mini_batches(rows, mini, max(1, int(epochs)), generator):
        if micro_batch_tokens:
            pieces = split_by_tokens(indices, row_tokens, int(micro_batch_tokens), key=budget_key, device=device)
        else:
            pieces = split_by_rows(indices, micro)
        shares = micro_batch_shares(pieces, loss_tokens)
        optimizer.zero_grad(set_to_none=True)
        step_metrics: dict[str, float] = defaultdict(float)
        for position, (piece, share) in enumerate(zip(pieces, shares)):
            micro_batch = {key: value[piece].to(device) for key, value in batch.items()}
            with _accumulating(model, sync=position == len(pieces) - 1):
                loss, metrics = loss_fn(micro_batch)
                (loss * share).backward()
            for key, value in metrics.items():
                step_metrics[key] += float(value) * share
            done += 1
            rank_progress.report(done, total, "micro-batches")
        grad_norm = clip_grad_norm(params, max_norm)
        if math.isfinite(grad_norm):
            optimizer.step()
        if after_step is not None:
            after_step()
        optimizer.zero_grad(set_to_none=True)
        step_metrics["grad_norm"] = grad_norm
        for key, value in step_metrics.items():
            totals[key] += value
        steps += 1
    return {key: value / max(1, steps) for key, value in totals.items()}
