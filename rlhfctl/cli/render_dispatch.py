"""Render a dispatch plan (rlhfctl.recipe.dispatch_plan) as rich tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from rlhfctl.cli.console import print_line

__all__ = ["format_tensor", "render_plan"]


def format_tensor(tensor: dict[str, Any]) -> str:
    """``responses (32, 32) int64``; shapes unknown statically print as ``?``."""
    shape = tensor.get("shape")
    if tensor["dtype"] == "dict":
        return f"{tensor['name']} (dict)"
    dims = "?" if shape is None else "(" + ", ".join(str(dim) for dim in shape) + ")"
    return f"{tensor['name']} {dims} {tensor['dtype']}"


def _roles_table(plan: dict[str, Any]) -> Table:
    table = Table(title="Roles", title_justify="left")
    for column in ("role", "worker class", "pool", "ranks", "colocated with", "missing methods"):
        table.add_column(column)
    for name, role in plan["roles"].items():
        missing = ", ".join(role["missing_methods"])
        table.add_row(Text(name, style="bold"), Text(role["class"]), Text(role["pool"]), Text(str(role["world_size"])),
                      Text(", ".join(role["colocated_with"]) or "-"), Text(missing or "-", style="red" if missing else ""))
    return table


def _methods_table(plan: dict[str, Any]) -> Table:
    table = Table(title="Registered methods", title_justify="left")
    for column in ("role.method", "dispatch mode", "execute mode", "blocking", "materialize_futures"):
        table.add_column(column)
    for name, role in plan["roles"].items():
        for method, spec in role["methods"].items():
            table.add_row(Text(f"{name}.{method}"), Text(str(spec["dispatch_mode"])), Text(str(spec["execute_mode"])),
                          Text(str(spec["blocking"]).lower()), Text(str(spec["materialize_futures"]).lower()))
    return table


def _mode_text(entry: dict[str, Any]) -> str:
    if entry["kind"] == "driver":
        return "driver"
    mode = entry["dispatch_mode"] or "not registered"
    if entry.get("execute_mode") == "RANK_ZERO":
        mode += "/RANK_ZERO"
    if entry.get("blocking") is False:
        mode += " (non-blocking)"
    return mode


def _dataflow_tree(plan: dict[str, Any]) -> Tree:
    batch = plan["batch"]
    title = Text(f"One training step: {batch['prompts']} prompts x n={batch['n']} = {batch['samples']} samples "
                 f"(prompt {batch['prompt_length']}, response {batch['response_length']} tokens); shapes per rank",
                 style="bold")
    tree = Tree(title)
    for entry in plan["dataflow"]:
        registered = entry.get("registered", True)
        head = Text(f"{entry['index']}. ")
        head.append(entry["call"], style="bold" if registered else "bold red")
        head.append(f"  {_mode_text(entry)}  ", style="cyan" if registered else "red")
        head.append(entry["summary"] if entry["kind"] != "driver" else entry["purpose"])
        node = tree.add(head)
        update = entry.get("update")
        if update and update.get("mini_batches") is not None:
            node.add(Text(f"{update['mini_batches']} mini-batch(es) x {update['ppo_epochs']} epoch(s), "
                          f"{update['mini_batch_rows_per_rank']} rows per rank each; micro-batches of "
                          f"{update['micro_batch_size']} -> {update['grad_accum_steps']} accumulation step(s)"))
        if entry.get("note"):
            node.add(Text(entry["note"], style="dim"))
        node.add(Text("in:  " + ", ".join(format_tensor(t) for t in entry["inputs"])))
        node.add(Text("out: " + ", ".join(format_tensor(t) for t in entry["outputs"])))
    return tree


def render_plan(console: Console, plan: dict[str, Any], show_roles: bool = True) -> None:
    """Roles, registered methods and the step's dataflow."""
    if show_roles and plan["roles"]:
        console.print(_roles_table(plan))
        console.print(_methods_table(plan))
    if plan["dataflow"]:
        console.print(_dataflow_tree(plan))
    else:
        print_line(console, "no dataflow step matches the filters")


IDLE_ROWS = 8  # hand-overs shown; the JSON output has them all


def render_trace_summary(console: Console, path: Any, summary: dict[str, Any]) -> None:
    """The dispatch trace of a run: one row per role.method, then the orchestration share."""
    table = Table(title=f"dispatch trace: {path}", title_justify="left")
    name_width = max((len(name) for name in summary["methods"]), default=11)
    table.add_column("role.method", justify="left", no_wrap=True, min_width=name_width)
    for column in ("calls", "slowest rank s", "fastest rank s", "imbalance", "in flight s", "mean in flight s", "MB sent"):
        table.add_column(column, justify="right")
    for name, entry in summary["methods"].items():
        imbalance = f"{entry['imbalance']:.2f}x" if entry.get("imbalance") else "-"
        table.add_row(name, str(entry["calls"]), f"{entry['slowest_rank_s']:.3f}", f"{entry['fastest_rank_s']:.3f}",
                      imbalance, f"{entry['total_s']:.3f}", f"{entry['mean_s']:.4f}", f"{entry['bytes_sent'] / 1e6:.2f}")
    console.print(table)
    print_line(console, "slowest/fastest rank s: compute on the ranks; in flight s: from sent to collected, "
                        "including the wait behind earlier calls to the same ranks")
    share = summary.get("orchestration_share")
    share_text = f"{100 * share:.1f}%" if share is not None else "n/a"
    console.print(f"steps {summary['steps']}, calls {summary['calls']}, time in steps {summary['step_s']:.2f} s (all steps), "
                  f"orchestration {summary['orchestration_s']:.3f} s ({share_text} of step time: driver-side dispatch, "
                  "collect, serialization and waiting that is not worker compute)")
    idle = summary.get("idle_by_boundary") or {}
    if idle:
        boundaries = Table(title="where no worker computes: by hand-over", title_justify="left")
        boundaries.add_column("call that ended -> call that started", justify="left", no_wrap=True)
        boundaries.add_column("ms per step", justify="right")
        boundaries.add_column("total s", justify="right")
        for boundary, entry in list(idle.items())[:IDLE_ROWS]:
            boundaries.add_row(boundary, f"{entry['per_step_ms']:.2f}", f"{entry['total_s']:.3f}")
        console.print(boundaries)
