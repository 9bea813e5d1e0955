"""The dispatch plan of a recipe: roles with their registered methods, and one training step's dataflow.

Built from the worker classes' ``@register`` specs without starting anything. The rollout group
(``rollout.placement: separate``) is a role here, with its worker class ``rollout.worker``. The JSON structure
(``rlhfctl inspect-dispatch --format json``) is documented in docs/cli.md; ``format_version`` changes
when it does.
"""

from __future__ import annotations

from typing import Any

from rlhfctl.recipe.arithmetic import UpdateRow, derive_batch_table
from rlhfctl.recipe.check_runtime import worker_classes
from rlhfctl.recipe.dataflow import StepCall, TensorSpec, resolve_dims, training_step
from rlhfctl.recipe.errors import RecipeError, did_you_mean
from rlhfctl.recipe.importing import import_class
from rlhfctl.recipe.off_policy import off_policy_corrections, sample_age
from rlhfctl.recipe.pools import DRIVER_POOL, PoolInfo, pool_of
from rlhfctl.recipe.resolve import ROLE_METHODS, ROLLOUT_ROLE
from rlhfctl.recipe.specs import Recipe
from rlhfctl.single_controller.decorator import registered_methods
from rlhfctl.single_controller.rows import RowLayout

__all__ = ["FORMAT_VERSION", "build_dispatch_plan", "summarize_rows"]

FORMAT_VERSION = 1


def _tensors(specs: tuple[TensorSpec, ...], rows: int | None, recipe: Recipe) -> list[dict[str, Any]]:
    if rows is None:
        return [{"name": spec.name, "shape": None, "dtype": spec.dtype} for spec in specs]
    return [{"name": spec.name, "shape": list(resolve_dims(spec, rows, recipe)), "dtype": spec.dtype} for spec in specs]


def summarize_rows(rows: int, unit: str, world_size: int, per_rank: int | None, padding: int, fan_out: int,
                   mode: str | None, execute: str) -> str:
    """One line such as ``16 prompts -> 2 ranks x 8 (-> 64 samples)`` or ``64 samples -> 3 ranks x 22 (2 padding rows)``."""
    if mode is None:
        return f"{rows} {unit}: method not registered"
    if per_rank is None:
        return f"{rows} {unit}: split by {mode} (rows per rank not known statically)"
    if mode == "ONE_TO_ALL":
        text = f"{rows} {unit} -> each of {world_size} ranks (broadcast)"
    else:
        text = f"{rows} {unit} -> {world_size} rank{'s' if world_size != 1 else ''} x {per_rank}"
        if padding:
            text += f" ({padding} padding row{'s' if padding != 1 else ''})"
    if execute == "RANK_ZERO":
        text += ", run on rank 0 only"
    if fan_out > 1:
        text += f" (-> {rows * fan_out} samples)"
    return text


def _role_entry(recipe: Recipe, role: str, worker: str, cls: type, pool: PoolInfo) -> dict[str, Any]:
    specs = registered_methods(cls)
    needed = list(ROLE_METHODS[ROLLOUT_ROLE] if role == ROLLOUT_ROLE else recipe.role(role).methods)
    return {
        "worker": worker,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "pool": pool.name,
        "world_size": pool.world_size,
        "ranks": list(range(pool.world_size)),
        "use_gpu": pool.use_gpu,
        "colocated_with": [other for other in pool.roles if other != role],
        "methods": {name: spec.describe() for name, spec in specs.items()},
        "required_methods": needed,
        "missing_methods": [name for name in needed if name not in specs],
    }


def _update_info(row: UpdateRow | None) -> dict[str, Any]:
    if row is None:
        return {}
    return {
        "mini_batch_size": row.mini_batch_size,
        "mini_batches": row.mini_batches,
        "mini_batch_rows_per_rank": row.mini_batch_rows_per_rank,
        "micro_batch_size": row.micro_batch_size,
        "grad_accum_steps": row.grad_accum,
        "ppo_epochs": row.ppo_epochs,
        "optimizer_steps": row.optimizer_steps,
    }


def _call_entry(recipe: Recipe, index: int, call: StepCall, roles: dict[str, Any], prompts: int, samples: int,
                updates: dict[str, UpdateRow]) -> dict[str, Any]:
    rows = {"prompts": prompts, "samples": samples}.get(call.unit, 0)  # a weight sync carries no batch rows
    entry: dict[str, Any] = {"index": index, "call": call.name, "role": call.role, "method": call.method,
                             "purpose": call.purpose, "note": call.note, "unit": call.unit, "rows_in": rows,
                             "pool": roles[call.role]["pool"] if call.role in roles else DRIVER_POOL}
    if call.role == "driver":
        entry.update(kind="driver", dispatch_mode=None, execute_mode=None, blocking=None, materialize_futures=None,
                     registered=True, world_size=1, ranks=[], rows_per_rank=rows, padding_rows=0, rows_out=rows,
                     out_rows_per_rank=rows, inputs=_tensors(call.inputs, rows, recipe),
                     outputs=_tensors(call.outputs, rows, recipe), summary=f"on the driver: {call.purpose}")
        return entry
    role = roles[call.role]
    spec = role["methods"].get(call.method)
    world = role["world_size"]
    mode = spec["dispatch_mode"] if spec else None
    execute = spec["execute_mode"] if spec else "ALL"
    per_rank, padding = None, 0
    if call.carries_rows and mode == "ALL_TO_ALL":
        layout = RowLayout(rows, world)
        per_rank, padding = layout.shard_size, layout.pad
    elif call.carries_rows and mode == "ONE_TO_ALL":
        per_rank = rows
    out_rows = None if per_rank is None else per_rank * call.fan_out
    entry.update(
        kind="call",
        dispatch_mode=mode,
        execute_mode=execute if spec else None,
        blocking=spec["blocking"] if spec else None,
        materialize_futures=spec["materialize_futures"] if spec else None,
        registered=spec is not None,
        world_size=world,
        ranks=[0] if execute == "RANK_ZERO" else list(range(world)),
        rows_per_rank=per_rank,
        padding_rows=padding,
        rows_out=rows * call.fan_out,
        out_rows_per_rank=out_rows,
        inputs=_tensors(call.inputs, per_rank, recipe),
        outputs=_tensors(call.outputs, out_rows, recipe) if not call.updates else [{"name": "metrics", "shape": None, "dtype": "dict"}],
        summary=(summarize_rows(rows, call.unit, world, per_rank, padding, call.fan_out, mode, execute)
                 if call.carries_rows or mode is None else f"{call.purpose} ({world} rank{'s' if world != 1 else ''})"),
    )
    if call.updates:
        entry["update"] = _update_info(updates.get(call.role))
    if call.role == "actor" and call.updates:
        entry["off_policy"] = _off_policy(recipe)
    return entry


def _off_policy(recipe: Recipe) -> dict[str, Any] | None:
    """The actor update's staleness: ``{"max_sample_age": k, "corrections": ["key: value", ...]}``, None on-policy."""
    age = sample_age(recipe)
    return {"max_sample_age": age, "corrections": off_policy_corrections(recipe)} if age > 0 else None


def _require_declared(recipe: Recipe) -> None:
    """RecipeError naming the first role (then the rollout group) whose pool ``resource_pools`` does not declare
    (a role may also run in the driver, the rollout group may not)."""
    declared = list(recipe.resource_pools)
    placed = [(f"roles.{role}.pool", spec.pool, (*declared, DRIVER_POOL)) for role, spec in recipe.roles.items()]
    if recipe.rollout.pool is not None:
        placed.append(("rollout.pool", recipe.rollout.pool, tuple(declared)))
    for key, pool, allowed in placed:
        if pool not in allowed:
            raise RecipeError(f"{key}: pool {pool!r} is not declared in resource_pools "
                              f"(declared: {', '.join(declared) or 'none'}){did_you_mean(pool, declared)}",
                              key_path=key, kind="invalid")


def build_dispatch_plan(recipe: Recipe, batch_size: int | None = None) -> dict[str, Any]:
    """``{"format_version", "batch", "pools", "roles", "dataflow"}`` for ``batch_size`` prompts (default trainer.batch_size).

    Raises RecipeError when a worker class does not import or a role's pool is undeclared.
    """
    pools = recipe.pools
    _require_declared(recipe)
    classes = worker_classes(recipe)
    workers = {role: spec.worker for role, spec in recipe.roles.items()}
    if recipe.rollout.pool is not None:
        workers[ROLLOUT_ROLE] = recipe.rollout.worker
        classes[ROLLOUT_ROLE] = import_class(workers[ROLLOUT_ROLE], "rollout.worker")
    roles = {role: _role_entry(recipe, role, workers[role], classes[role], pool_of(pools, role)) for role in workers}  # type: ignore[arg-type]
    n = int(recipe.rollout.settings.n)
    prompts = int(batch_size if batch_size is not None else recipe.trainer.batch_size)
    samples = prompts * n
    table, _ = derive_batch_table(recipe, prompts)
    updates = {row.role: row for row in table.updates}
    dataflow = [_call_entry(recipe, index, call, roles, prompts, samples, updates)
                for index, call in enumerate(training_step(recipe), start=1)]
    return {
        "format_version": FORMAT_VERSION,
        "batch": {"prompts": prompts, "n": n, "samples": samples,
                  "prompt_length": int(recipe.data.max_prompt_length), "response_length": recipe.rollout.response_width},
        "pools": {name: pool.to_dict() for name, pool in pools.items()},
        "roles": roles,
        "dataflow": dataflow,
    }
