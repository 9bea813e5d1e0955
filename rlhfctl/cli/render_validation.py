"""Render a ValidationReport with rich: issues, pools and colocation, and the derived batch table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlhfctl.cli.console import print_line
from rlhfctl.recipe.report import ValidationReport

__all__ = ["render_issues", "render_pools", "render_batch", "render_report"]


def _cell(value: object, style: str = "") -> Text:
    return Text("-" if value is None else str(value), style=style)


def render_issues(console: Console, report: ValidationReport, errors_console: Console | None = None) -> None:
    """Warnings (yellow) then errors (red), one line each, naming the key path."""
    for issue in report.warnings:
        print_line(console, f"warning: {issue.message}", "yellow")
    for issue in report.errors:
        print_line(errors_console or console, f"error: {issue.message}", "bold red")


def render_pools(console: Console, report: ValidationReport) -> None:
    """Pools with their ranks, GPUs and colocated roles."""
    table = Table(title="Resource pools and colocation", title_justify="left")
    for column in ("pool", "ranks", "process_on_nodes", "GPUs", "roles (colocated in one process per rank)"):
        table.add_column(column)
    for pool in report.pools.values():
        roles = ", ".join(pool.roles) or "(unused)"
        nodes = "the driver process" if pool.in_driver else list(pool.process_on_nodes)
        table.add_row(_cell(pool.name), _cell(pool.world_size), _cell(nodes), _cell(pool.gpus), _cell(roles))
    console.print(table)


def render_batch(console: Console, report: ValidationReport) -> None:
    """Prompts and samples per step, per-rank shards of each call, and mini/micro-batches of the updates."""
    batch = report.batch
    if batch is None:
        return
    print_line(console, (
        f"per step: {batch.prompts_per_step} prompts (trainer.batch_size) x n={batch.n} (rollout.n) "
        f"= {batch.samples_per_step} samples, rollout engine: {batch.engine} (rollout.engine)"
    ), "bold")
    shards = Table(title="Per-rank shards (ALL_TO_ALL: rows split evenly, the last rows repeated as padding)", title_justify="left")
    for column in ("call", "pool", "ranks", "rows in", "rows per rank", "padding rows", "rows out"):
        shards.add_column(column, justify="left" if column in ("call", "pool") else "right")
    for row in batch.shards:
        shards.add_row(_cell(row.call), _cell(row.pool), _cell(row.world_size), _cell(f"{row.rows} {row.unit}"),
                       _cell(row.rows_per_rank), _cell(row.padding, "yellow" if row.padding else ""), _cell(row.rows_out))
    console.print(shards)
    if not batch.updates:
        return
    updates = Table(title="Updates per step", title_justify="left")
    for column in ("role", "ranks", "mini", "minis", "samples/mini", "rows/rank/mini", "micro", "accum", "epochs", "opt steps"):
        updates.add_column(column, justify="left" if column == "role" else "right")
    for row in batch.updates:
        updates.add_row(_cell(row.role), _cell(row.world_size), _cell(row.mini_batch_size), _cell(row.mini_batches),
                        _cell(row.mini_batch_samples), _cell(row.mini_batch_rows_per_rank), _cell(row.micro_batch_size),
                        _cell(row.grad_accum), _cell(row.ppo_epochs), _cell(row.optimizer_steps))
    console.print(updates)
    print_line(console, (
        "mini = mini_batch_size prompts per optimizer step; minis = mini-batches per step (batch_size / mini); "
        "samples/mini = mini x n, split over the ranks into rows/rank/mini; micro = micro_batch_size rows per "
        "forward/backward on one rank; accum = rows/rank/mini / micro; opt steps = minis x epochs"
    ), "dim")


def render_report(console: Console, report: ValidationReport, errors_console: Console | None = None) -> None:
    """The whole report: pools, batch table, issues, and a closing verdict line."""
    if report.pools:
        render_pools(console, report)
    render_batch(console, report)
    render_issues(console, report, errors_console)
    warnings = len(report.warnings)
    if report.ok:
        print_line(console, f"recipe is valid ({warnings} warning{'s' if warnings != 1 else ''})", "bold green")
    else:
        errors = len(report.errors)
        print_line(errors_console or console, f"recipe has {errors} error{'s' if errors != 1 else ''} and {warnings} warning{'s' if warnings != 1 else ''}", "bold red")
