"""``rlhfctl inspect-dispatch``: how each role's methods are dispatched, and one training step's dataflow.

The recipe mode imports the worker classes and reads their ``@register`` specs; nothing starts. The
trace mode summarizes a finished run's trace.json. Both render as rich tables (``render_plan``,
``render_trace_summary``) or as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from rlhfctl.cli.console import OutputFormat, OverridesArg, complete_recipe, load_for_command, make_console, print_line
from rlhfctl.cli.errors import EXIT_USER, guarded
from rlhfctl.cli.validate import render_issues
from rlhfctl.recipe.errors import did_you_mean
from rlhfctl.recipe.specs import Recipe
from rlhfctl.recipe.stages import check_ppo_family

__all__ = ["filter_plan", "format_tensor", "inspect_dispatch", "render_plan", "render_trace_summary"]

_ROLE_CHOICES = ("actor", "reference", "critic", "reward", "rollout", "driver")


def inspect_dispatch(
    recipe: Optional[str] = typer.Argument(None, show_default=False, autocompletion=complete_recipe,
                                           help="recipe YAML file or bundled recipe name (omit with --trace)"),
    overrides: Optional[List[str]] = OverridesArg(),
    role: Optional[str] = typer.Option(None, "--role", help="only this role (actor, reference, critic, reward, rollout, driver)",
                                       autocompletion=lambda: list(_ROLE_CHOICES)),
    method: Optional[str] = typer.Option(None, "--method", help="only this method, e.g. generate_sequences"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="prompts per step (default trainer.batch_size)"),
    output_format: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table for people, json for tools"),
    trace: Optional[Path] = typer.Option(None, "--trace", metavar="RUN_DIR",
                                         help="summarize RUN_DIR/trace.json of a finished run (trainer.trace=true)"),
) -> None:
    """Show how a recipe's roles are dispatched, and one training step's dataflow.

    Without starting anything: each role's worker class, pool, ranks and colocated roles; each
    registered method's dispatch mode, execute mode, blocking and materialize_futures; and the calls
    of one training step in order, each with its pool, per-rank rows (padding included) and tensor
    shapes. A recipe that `rlhfctl validate` rejects gets its errors instead (exit 2).

    Examples:

      rlhfctl inspect-dispatch recipes/quickstart.yaml

      rlhfctl inspect-dispatch quickstart "resource_pools.score={process_on_nodes: [3]}" roles.reward.pool=score --role reward

      rlhfctl inspect-dispatch ppo-gae --method update_actor --batch-size 32 --format json

      rlhfctl inspect-dispatch --trace runs/quickstart
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        if trace is not None:
            _show_trace(console, trace, role, method, output_format)
            return
        if recipe is None:
            raise typer.BadParameter("give a RECIPE to inspect, or --trace RUN_DIR to summarize a run", param_hint="RECIPE")
        plan = _recipe_plan(recipe, overrides, batch_size)
        plan = filter_plan(plan, role, method)
        if output_format is OutputFormat.json:
            console.file.write(json.dumps(plan, indent=2) + "\n")
        else:
            render_plan(console, plan)


# ---------------------------------------------------------------------------------- trace mode
def _show_trace(console: Any, run_dir: Path, role: Optional[str], method: Optional[str], output_format: OutputFormat) -> None:
    """Summarize a run's trace.json: calls and time per role.method, rank imbalance, bytes, orchestration."""
    from rlhfctl.trace import TRACE_FILE, summarize_trace  # pulls in torch: off the CLI's fast path

    path = run_dir / TRACE_FILE if run_dir.is_dir() else run_dir
    if not path.exists():
        raise typer.BadParameter(f"{path} not found; run training with trainer.trace=true to record one",
                                 param_hint="--trace")
    summary = summarize_trace(path)
    summary["methods"] = {name: entry for name, entry in summary["methods"].items()
                          if (role is None or name.split(".")[0] == role) and (method is None or name.split(".", 1)[1] == method)}
    if output_format is OutputFormat.json:
        console.file.write(json.dumps({"trace": str(path), **summary}, indent=2) + "\n")
        return
    render_trace_summary(console, path, summary)


# ---------------------------------------------------------------------------------- recipe mode
def _recipe_plan(recipe: str, overrides: Optional[List[str]], batch_size: Optional[int]) -> dict[str, Any]:
    """The dispatch plan of a recipe (rlhfctl.recipe.dispatch_plan.build_dispatch_plan)."""
    cfg, path = load_for_command(recipe, overrides)  # before the heavy imports: a typo fails in a second
    from rlhfctl.recipe.dispatch_plan import build_dispatch_plan  # pulls in torch: after the recipe loads

    check_ppo_family(cfg, "inspect-dispatch")
    recipe = _require_valid(cfg, batch_size)
    plan = build_dispatch_plan(recipe, batch_size=batch_size)
    return {"recipe": str(path), **plan}


def _require_valid(cfg: Any, batch_size: Optional[int]) -> Recipe:
    """Validate's errors, printed on stderr with exit 2, instead of a plan that cannot run; else the recipe validate
    resolved (once)."""
    from rlhfctl.recipe.validate import validate_recipe  # pulls in torch: after the recipe loads

    report = validate_recipe(cfg, batch_size=batch_size)
    if not report.ok:
        render_issues(make_console(stderr=True), report)
        raise typer.Exit(EXIT_USER)
    return report.recipe


def filter_plan(plan: dict[str, Any], role: Optional[str], method: Optional[str]) -> dict[str, Any]:
    """Keep only ``role`` and/or ``method``; unknown names raise typer.BadParameter (exit 2)."""
    if role is not None:
        present = [*plan["roles"], "driver"]
        if role not in present:
            absent = " (not in this recipe)" if role in _ROLE_CHOICES else ""
            raise typer.BadParameter(f"{role!r}{absent}; roles here: {', '.join(present)}{did_you_mean(role, present)}", param_hint="--role")
        plan = {**plan, "roles": {name: value for name, value in plan["roles"].items() if name == role},
                "dataflow": [entry for entry in plan["dataflow"] if entry["role"] == role]}
    if method is not None:
        known = sorted({name for value in plan["roles"].values() for name in value["methods"]}
                       | {entry["method"] for entry in plan["dataflow"]})
        if method not in known:
            raise typer.BadParameter(f"{method!r}; methods here: {', '.join(known)}{did_you_mean(method, known)}", param_hint="--method")
        roles = {}
        for name, value in plan["roles"].items():
            if method in value["methods"]:
                roles[name] = {**value, "methods": {method: value["methods"][method]}}
        plan = {**plan, "roles": roles, "dataflow": [entry for entry in plan["dataflow"] if entry["method"] == method]}
    return plan


# ---------------------------------------------------------------------------------- rendering
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
        head.append(f"[{entry['pool']}] ", style="magenta")
        head.append(entry["summary"] if entry["kind"] != "driver" else entry["purpose"])
        node = tree.add(head)
        update = entry.get("update")
        if update and update.get("mini_batches") is not None:
            node.add(Text(f"{update['mini_batches']} mini-batch(es) x {update['ppo_epochs']} epoch(s), "
                          f"{update['mini_batch_rows_per_rank']} rows per rank each; micro-batches of "
                          f"{update['micro_batch_size']} -> {update['grad_accum_steps']} accumulation step(s)"))
        if entry.get("note"):
            uncorrected = entry.get("off_policy") is not None and not entry["off_policy"]["corrections"]
            node.add(Text(entry["note"], style="yellow" if uncorrected else "dim"))  # stale samples, nothing corrects
        if entry["inputs"] or entry["outputs"]:  # a weight sync moves no batch keys
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
