"""Render the memory plan of ``rlhfctl validate``: per role and rank, then per process against the device."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlhfctl.cli.console import print_line
from rlhfctl.recipe.memory_plan import MemoryPlan

__all__ = ["format_bytes", "render_memory"]


def format_bytes(count: int | None) -> str:
    """``1.50 GiB``, ``12.0 MiB``, ``512 B``: the largest binary unit that keeps the number >= 1."""
    if count is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count} B"


def _count(number: int) -> str:
    for suffix, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if number >= size:
            return f"{number / size:.1f}{suffix}"
    return str(number)


def _ranks_cell(world: int, ranks: list[int]) -> str:
    return "all" if len(ranks) == world and world > 1 else ", ".join(str(rank) for rank in ranks)


def render_memory(console: Console, plan: MemoryPlan | None) -> None:
    """The plan's tables; ranks holding the same bytes share a row."""
    if plan is None or (not plan.roles and not plan.skipped):
        return
    table = Table(title="Memory plan per rank (from the model configs, no weights loaded)", title_justify="left")
    for column in ("role", "ranks", "strategy", "params", "precision", "parameters", "gradients",
                   "optimizer", "KV cache", "offload"):
        table.add_column(column, justify="left" if column in ("role", "ranks", "strategy", "precision") else "right")
    for role in plan.roles:
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in role.ranks:
            groups.setdefault((rank.param_bytes, rank.grad_bytes, rank.optimizer_bytes, rank.kv_cache_bytes), []).append(rank.rank)
        for (params, grads, optimizer, kv), ranks in groups.items():
            count = _count(role.parameters)
            trained = (count if role.trainable_parameters == role.parameters else
                       f"{_count(role.trainable_parameters)}/{count}") if role.trainable else count
            precision = "fp32 master" if role.trainable else f"{role.param_dtype} frozen"
            table.add_row(role.role, _ranks_cell(role.world_size, ranks), role.strategy, trained, precision,
                          format_bytes(params), format_bytes(grads), format_bytes(optimizer), format_bytes(kv),
                          "cpu" if role.ranks[0].offloaded else "-")
    console.print(table)
    device = plan.device_memory
    for pool, total in plan.process_bytes().items():
        share = f" of {format_bytes(device)} ({100 * total / device:.1f}%, from {plan.device_source})" if device else ""
        style = "bold red" if device and total > device else ""
        print_line(console, f"pool {pool}: {format_bytes(total)} per process (roles colocated there, largest rank){share}", style)
    for role, reason in plan.skipped.items():
        print_line(console, Text(f"memory plan: roles.{role} skipped ({reason})").plain, "yellow")
