"""``rlhfctl inspect-dispatch``: how each role's methods are dispatched, and one training step's dataflow.

The recipe mode (below) imports the worker classes and reads their ``@register`` specs; nothing starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional

import typer

from rlhfctl.cli.console import make_console
from rlhfctl.cli.errors import guarded
from rlhfctl.cli.options import OutputFormat, OverridesArg, complete_recipe

__all__ = ["filter_plan", "inspect_dispatch"]

_ROLE_CHOICES = ("actor", "reference", "critic", "reward", "driver")


def inspect_dispatch(
    recipe: Optional[str] = typer.Argument(None, show_default=False, autocompletion=complete_recipe,
                                           help="recipe YAML file or bundled recipe name (omit with --trace)"),
    overrides: Optional[List[str]] = OverridesArg(),
    role: Optional[str] = typer.Option(None, "--role", help="only this role (actor, reference, critic, reward, driver)",
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
            from rlhfctl.cli.render_dispatch import render_plan

            render_plan(console, plan)


# ---------------------------------------------------------------------------------- trace mode
def _show_trace(console: Any, run_dir: Path, role: Optional[str], method: Optional[str], output_format: OutputFormat) -> None:
    """Summarize a run's trace.json: calls and time per role.method, rank imbalance, bytes, orchestration."""
    from rlhfctl.trace import TRACE_FILE, summarize_trace

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
    from rlhfctl.cli.render_dispatch import render_trace_summary

    render_trace_summary(console, path, summary)


# ---------------------------------------------------------------------------------- recipe mode
def _recipe_plan(recipe: str, overrides: Optional[List[str]], batch_size: Optional[int]) -> dict[str, Any]:
    """The dispatch plan of a recipe (rlhfctl.recipe.dispatch_plan.build_dispatch_plan)."""
    from rlhfctl.cli.recipe_args import load_for_command
    from rlhfctl.recipe.dispatch_plan import build_dispatch_plan

    cfg, path = load_for_command(recipe, overrides)
    from rlhfctl.recipe.stages import check_ppo_family

    check_ppo_family(cfg, "inspect-dispatch")
    _require_valid(cfg, batch_size)
    plan = build_dispatch_plan(cfg, batch_size=batch_size)
    return {"recipe": str(path), **plan}


def _require_valid(cfg: Any, batch_size: Optional[int]) -> None:
    """Validate's errors, printed on stderr with exit 2, instead of a plan that cannot run."""
    from rlhfctl.cli.console import make_console
    from rlhfctl.cli.errors import EXIT_USER
    from rlhfctl.cli.render_validation import render_issues
    from rlhfctl.recipe.validate import validate_recipe

    report = validate_recipe(cfg, batch_size=batch_size)
    if not report.ok:
        render_issues(make_console(stderr=True), report)
        raise typer.Exit(EXIT_USER)


def filter_plan(plan: dict[str, Any], role: Optional[str], method: Optional[str]) -> dict[str, Any]:
    """Keep only ``role`` and/or ``method``; unknown names raise typer.BadParameter (exit 2)."""
    from rlhfctl.recipe.errors import did_you_mean

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
