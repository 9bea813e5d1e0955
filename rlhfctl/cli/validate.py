"""``rlhfctl validate``: check a recipe without starting anything and show its derived batch table.

The report is rendered with rich: issues, pools and colocation, the batch table, the memory plan, what was
read of each data file and the first training prompt as the model sees it (``render_report``);
``rlhfctl train`` shows the issues the same way (``render_issues``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlhfctl.cli.console import (OutputFormat, OverridesArg, RecipeArg, load_for_command, make_console, print_line,
                                 refuse_missing_paths, resolve_recipe_path)
from rlhfctl.cli.errors import EXIT_USER, guarded
from rlhfctl.errors import UserError
from rlhfctl.pipeline import load_pipeline
from rlhfctl.pipeline.load import is_pipeline_file
from rlhfctl.pipeline.observer import PipelineObserver
from rlhfctl.pipeline.runner import plan_stages
from rlhfctl.recipe.errors import RecipeError, error

if TYPE_CHECKING:  # only for annotations: the recipe package is imported when a command runs, not at startup
    from rlhfctl.data.summary import DataFileSummary
    from rlhfctl.recipe.arithmetic import EpochRow
    from rlhfctl.recipe.example_prompt import ExamplePrompt
    from rlhfctl.recipe.memory_plan import MemoryPlan
    from rlhfctl.recipe.task_listing import TaskListing
    from rlhfctl.recipe.validate import ValidationReport

__all__ = ["render_batch", "render_data", "render_example", "render_issues", "render_pools", "render_report",
           "render_tasks", "validate"]

def validate(
    recipe: str = RecipeArg(),
    overrides: Optional[List[str]] = OverridesArg(),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="prompts per step for the table (default trainer.batch_size)"),
    output_format: OutputFormat = typer.Option(OutputFormat.table, "--format", help="table for people, json for tools"),
    device_memory: Optional[str] = typer.Option(None, "--device-memory", help="memory of one device to compare each call's plan with; a bare number is GiB (80 = 80GiB), or give a unit: 80GiB, 80GB, 81920MiB (default: CUDA's, when visible)"),
) -> None:
    """Check a recipe without starting anything, and show its batch-size table.

    Checks keys and types, worker classes and their registered methods, pools (against ray.num_cpus /
    ray.num_gpus or this machine), what the algorithm needs, and the batch-size arithmetic (per-rank
    shards with padding, mini-batches, micro-batches and gradient accumulation); then, with the run's
    own code, the first records of each data file (shown as a table: rows, prompt form, where the
    ground truth comes from, columns), the reward function's signature against the data's columns
    (ground_truth from reward_model.ground_truth in verl's layout), inline model config keys, and that
    model paths are local, cached or on a reachable hub.
    Shows the memory plan: each role's state per rank, then each pool's bytes per process during every
    call of the step (rollout, log-prob passes, updates) and the peak call, against --device-memory (a
    bare number is GiB; else CUDA's, when visible). A call above the device, or a vLLM engine whose weights
    shard and one sequence's KV cache exceed its share, is an error (exit 2) naming the knobs that would
    make it fit, with values; a call above 90% of the device is a warning.
    With the actor's tokenizer on disk (roles.actor.model.path or tokenizer_path) and data.train_files,
    shows the first prompt as the model sees it (after the chat template), its token count and the
    decode(encode(text)) round trip; a tokenizer that drops or merges characters, or that loads as
    another class than tokenizer_config.json saved, is a warning.
    No weights are loaded.
    A pipeline file (top-level `stages:`) gets every stage's recipe checked the way `rlhfctl pipeline`
    checks them before it runs; overrides are then `output_dir=DIR` or `STAGE.KEY=value`.
    Exits 2 when there is an error.

    Examples:

      rlhfctl validate recipes/quickstart.yaml

      rlhfctl validate quickstart resource_pools.main.process_on_nodes=[3]

      rlhfctl validate my.yaml --format json
    """
    console, err = make_console(), make_console(stderr=True)
    with guarded(err):
        device_bytes = _device_bytes(device_memory)
        loaded = _load_or_report(recipe, overrides, output_format, console)  # before the heavy imports
        if loaded is None:  # a pipeline file
            _validate_pipeline(resolve_recipe_path(recipe), overrides, output_format, console, err)
            return
        cfg, path = loaded
        if output_format is OutputFormat.table:  # a tool asking for JSON gets the whole report
            refuse_missing_paths(cfg, err)
        from rlhfctl.recipe.validate import validate_recipe  # pulls in torch: after the recipe loads

        report = validate_recipe(cfg, batch_size=batch_size, device_memory=device_bytes)
        if output_format is OutputFormat.json:
            console.file.write(json.dumps({"recipe": str(path), **report.to_dict()}, indent=2) + "\n")
        else:
            print_line(console, f"recipe: {path}", "bold")
            render_report(console, report, errors_console=err)
        if not report.ok:
            raise typer.Exit(EXIT_USER)


def _load_or_report(recipe: str, overrides: Optional[List[str]], output_format: OutputFormat,
                    console: Any) -> Optional[tuple[Any, Path]]:
    """(recipe, path), or None for a pipeline file; on a load error with --format json, the JSON report
    (that one error) on stdout first, then the error as usual (stderr, exit 2)."""
    try:
        if is_pipeline_file(resolve_recipe_path(recipe)):
            return None
        return load_for_command(recipe, overrides)
    except RecipeError as failure:
        if output_format is OutputFormat.json:
            from rlhfctl.recipe.validate import ValidationReport  # pulls in torch: off the CLI's fast path

            report = ValidationReport(issues=[error(failure.key_path, str(failure))])
            console.file.write(json.dumps({"recipe": recipe, **report.to_dict()}, indent=2) + "\n")
        raise


class DeviceMemoryError(UserError):
    """``--device-memory`` is not a positive memory size (exit 2, one line naming the option)."""


def _device_bytes(text: Optional[str]) -> Optional[int]:
    """--device-memory as bytes (a bare number is GiB); anything else is a user error naming the option."""
    if text is None:
        return None
    from rlhfctl.recipe.memory_plan import parse_memory_size  # pulls in torch: off the CLI's fast path

    try:
        return parse_memory_size(text)
    except ValueError as problem:
        raise DeviceMemoryError(f"--device-memory: {problem}") from None


def _validate_pipeline(path: Path, overrides: Optional[List[str]], output_format: OutputFormat, console: Any,
                       err: Any) -> None:
    """Load and check every stage of a pipeline file (PipelineError, exit 2, names the stage and key)."""
    warnings: list[str] = []

    class _Warnings(PipelineObserver):
        def message(self, text: str, level: str = "info") -> None:
            warnings.append(text)

    spec = load_pipeline(path, list(overrides or []))
    plans = plan_stages(spec, _Warnings())
    stages = [{"name": plan.name, "algorithm": plan.algorithm, "recipe": plan.recipe, "output_dir": str(plan.directory)}
              for plan in plans]
    if output_format is OutputFormat.json:
        report = {"pipeline": str(path), "ok": True, "output_dir": str(spec.output_dir), "stages": stages,
                  "warnings": warnings}
        console.file.write(json.dumps(report, indent=2) + "\n")
        return
    print_line(console, f"pipeline: {path} (output_dir {spec.output_dir})", "bold")
    for stage in stages:
        print_line(console, f"  stage {stage['name']}: {stage['algorithm']}, {stage['recipe']} -> {stage['output_dir']}")
    for text in warnings:
        print_line(err, f"warning: {text}", "yellow")
    print_line(console, f"ok: {len(stages)} stages; outputs of earlier stages are checked again when each stage runs",
               "green")


# ---------------------------------------------------------------------------------- rendering the report
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
    _render_epoch(console, batch.epoch, batch.prompts_per_step)
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


def _render_epoch(console: Console, epoch: EpochRow | None, batch_size: int) -> None:
    """Steps per epoch, and the prompts the last partial batch leaves out of each epoch."""
    if epoch is None:
        return
    line = f"per epoch: {epoch.prompts} training prompts = {epoch.steps_per_epoch} steps of {batch_size}"
    if not epoch.dropped_per_epoch:
        print_line(console, line)
        return
    which = ("reshuffled every epoch, so different ones each time" if epoch.shuffled
             else "data.shuffle is off, so always the same ones: they never train")
    print_line(console, (
        f"{line}; the last {epoch.dropped_per_epoch} prompts of each epoch (a partial batch) are left out "
        f"({which})"
    ), "yellow")


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
    """The plan: each role's state per rank, then each pool's bytes per call and its peak (a role the plan
    skipped is a warning of the report, shown with the others)."""
    if plan is None or not plan.roles:
        return
    _render_state(console, plan)
    for pool in plan.phases:
        _render_phases(console, plan, pool)
        _render_engine(console, plan, pool)


def _render_engine(console: Console, plan: MemoryPlan, pool: str) -> None:
    """The pool's vLLM engine per rank: its weights shard and one sequence's KV cache against its share of the device."""
    engine = plan.engines.get(pool)
    if engine is None:
        return
    verdict = "fits" if engine.fits else "does not fit"
    print_line(console, (f"pool {pool}: vLLM engine at tensor_parallel_size {engine.tensor_parallel_size}: weights "
                         f"{format_bytes(engine.weights)} + one sequence's KV cache {format_bytes(engine.kv_cache)} = "
                         f"{format_bytes(engine.needed)} per rank {verdict} its share {format_bytes(engine.budget)} "
                         f"(gpu_memory_utilization {engine.share:g}); the rest of the share is KV cache"),
               "bold" if engine.fits else "bold red")
    print_line(console, f"  = {engine.formula}", "dim")


def _render_state(console: Console, plan: MemoryPlan) -> None:
    """Each role's parameters, gradients, optimizer state (and the hf engine's KV cache) per rank; equal ranks share a row."""
    table = Table(title="Memory plan: state per rank (from the model configs, no weights loaded)", title_justify="left")
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
                          _offload_cell(role))
    console.print(table)


def _offload_cell(role: Any) -> str:
    """``cpu`` (cpu_offload: always on the host), or what waits on the host between calls (param/optimizer_offload)."""
    if role.ranks[0].offloaded:
        return "cpu"
    parts = [name for name, on in (("params", role.param_offload), ("optim", role.optimizer_offload)) if on]
    return "+".join(parts) if parts else "-"


def _render_phases(console: Console, plan: MemoryPlan, pool: str) -> None:
    """One column per call of the step (its phase above it), one row per term, the totals, and the peak call."""
    peak = plan.peak(pool)
    if peak is None:
        return
    terms = plan.phase_terms(pool, peak.rank)
    phases = [phase for phase in plan.phases[pool] if phase.rank == peak.rank]
    table = Table(title=f"Memory plan: pool {pool}, rank {peak.rank}, bytes per process during each call "
                        "(colocated roles share the process)", title_justify="left")
    table.add_column("term", no_wrap=True)
    for phase in phases:
        role, method = phase.call.split(".", 1)
        table.add_column(f"{phase.group}\n{role}.\n{method}", justify="right")
    names = list(dict.fromkeys(name for phase in phases for name in terms[phase.call]))
    hosted = {(phase.call, term.name) for phase in phases for term in phase.terms if term.kind == "state" and not term.bytes}
    for name in names:
        cells = [terms[phase.call].get(name, "") for phase in phases]
        table.add_row(name, *("" if cell == "" else ("? (needs --device-memory)" if cell is None else
                                                     "host" if (phase.call, name) in hosted else format_bytes(cell))
                              for phase, cell in zip(phases, cells)))
    device = plan.device_memory
    table.add_row(Text("total", style="bold"), *(Text(format_bytes(phase.total), style=_share_style(phase.total, device))
                                                  for phase in phases))
    if device:
        table.add_row("of the device", *(f"{100 * phase.total / device:.1f}%" for phase in phases))
    console.print(table)
    share = f" of {format_bytes(device)} ({100 * peak.total / device:.1f}%, from {plan.device_source})" if device else ""
    style = _share_style(peak.total, device)
    print_line(console, f"pool {pool}: peak {peak.group} ({peak.call}), {format_bytes(peak.total)} per process on rank {peak.rank}{share}", style)
    for term in peak.terms:
        print_line(console, f"  {term.name}: {format_bytes(term.bytes) if term.bytes is not None else '?'} = {term.formula}", "dim")
    unknown = list(dict.fromkeys(name for phase in phases for name in phase.unknown))
    if unknown:
        print_line(console, f"pool {pool}: {', '.join(unknown)} not counted: give --device-memory (a bare number is GiB)", "yellow")


def _share_style(total: int, device: int | None) -> str:
    """Red above the device (an error), yellow above 90% of it (a warning)."""
    from rlhfctl.recipe.memory_plan import TIGHT_SHARE  # pulls in torch: off the CLI's fast path

    if not device or total <= TIGHT_SHARE * device:
        return "bold"
    return "bold red" if total > device else "bold yellow"


def render_data(console: Console, summaries: list[DataFileSummary]) -> None:
    """Each data file as preflight read it: rows, prompt form, the key of the ground truth, the columns."""
    if not summaries:
        return
    from rlhfctl.recipe.preflight import SAMPLE_RECORDS  # the data and reward modules (numpy): off the CLI's fast path

    table = Table(title=f"Data files (prompt, ground truth and columns from the first {SAMPLE_RECORDS} rows of each)",
                  title_justify="left")
    for column in ("key", "file", "rows", "prompt", "ground truth", "columns"):
        table.add_column(column, justify="right" if column == "rows" else "left",
                         no_wrap=column in ("key", "rows"), overflow="fold")
    for summary in summaries:
        truth = summary.ground_truth
        if truth is not None and summary.ground_truth_rows < summary.sampled:
            truth = f"{truth} (set in {summary.ground_truth_rows} of {summary.sampled} rows)"
        table.add_row(_cell(summary.key), _cell(summary.path), _cell(summary.rows), _cell(summary.prompt),
                      _cell(truth if truth is not None else "none", "" if truth is not None else "yellow"),
                      _cell(", ".join(summary.columns)))
    console.print(table)


def render_tasks(console: Console, tasks: list[TaskListing]) -> None:
    """The tasks the prompts are generated from: name, data_source, weight, prompts per split, an example prompt."""
    if not tasks:
        return
    table = Table(title="Tasks (prompts generated at run time; the validation split from another seed than training)",
                  title_justify="left")
    for column in ("key", "task", "data_source", "weight", "train", "val", "example prompt"):
        table.add_column(column, justify="right" if column in ("weight", "train", "val") else "left",
                         no_wrap=column in ("key", "weight", "train", "val"), overflow="fold")
    for task in tasks:
        table.add_row(_cell(task.key), _cell(task.name), _cell(task.data_source),
                      _cell(None if task.weight is None else f"{task.weight:g}"), _cell(task.train), _cell(task.val),
                      _cell(task.example))
    console.print(table)


_SHOWN_LINES = 24
_SHOWN_CHARACTERS = 2000


def render_example(console: Console, example: ExamplePrompt | None) -> None:
    """The first training prompt as the model sees it (each line behind a bar), its tokens and the round trip."""
    if example is None:
        return
    template = "after the chat template (data.apply_chat_template)" if example.chat_template else "no chat template"
    print_line(console, (f"example prompt: {example.source} record 1, {template}, tokenizer {example.tokenizer_class} "
                         f"({example.key}):"), "bold")
    shown = example.text[:_SHOWN_CHARACTERS]
    lines = shown.split("\n")
    for line in lines[:_SHOWN_LINES]:
        print_line(console, f"  | {line}")
    hidden = len(example.text) - len("\n".join(lines[:_SHOWN_LINES]))
    if hidden > 0:
        print_line(console, f"  | ... ({hidden} more characters)", "dim")
    pieces = " ".join(repr(piece) for piece in example.pieces)
    more = f" ... ({example.tokens - len(example.pieces)} more)" if example.tokens > len(example.pieces) else ""
    print_line(console, f"  tokens: {pieces}{more}", "dim")
    limit = example.max_prompt_length
    bound = "" if example.tokens <= limit else {
        "truncate": f", over it: the run keeps the last {limit} (data.overlong=truncate)",
        "skip": ", over it: the run skips this record (data.overlong=skip)",
    }.get(example.overlong, ", over it")
    print_line(console, (f"  {example.tokens} tokens for {example.characters} characters "
                         f"(data.max_prompt_length {limit}{bound})"))
    if example.round_trip is None:
        print_line(console, "  round trip: decode(encode(text)) == text", "green")
    else:
        print_line(console, f"  round trip: decode(encode(text)) differs {example.round_trip}", "yellow")


def render_report(console: Console, report: ValidationReport, errors_console: Console | None = None) -> None:
    """The whole report: pools, batch table, memory plan, data files, example prompt, issues, and a closing verdict line."""
    if report.pools:
        render_pools(console, report)
    render_batch(console, report)
    render_memory(console, report.memory)
    render_data(console, report.data)
    render_tasks(console, report.tasks)
    render_example(console, report.example)
    for note in report.notes:
        print_line(console, f"note: {note}")
    render_issues(console, report, errors_console)
    warnings = len(report.warnings)
    if report.ok:
        print_line(console, f"recipe is valid ({warnings} warning{'s' if warnings != 1 else ''})", "bold green")
    else:
        errors = len(report.errors)
        print_line(errors_console or console, f"recipe has {errors} error{'s' if errors != 1 else ''} and {warnings} warning{'s' if warnings != 1 else ''}", "bold red")
