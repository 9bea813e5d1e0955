"""The few settings worth seeing before a run starts: recipe, model, algorithm, pools, batch, output.

``rlhfctl train`` prints them for every recipe; sft, reward_model and dpo recipes get their own lines
(``stage_rows``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlhfctl.recipe.specs import Recipe
from rlhfctl.recipe.stages import STAGES
from rlhfctl.recipe.validate import ValidationReport

__all__ = ["render_essentials", "stage_rows"]

_UNITS = {"sft": "demonstrations", "reward_model": "preference pairs", "dpo": "preference pairs"}


def render_essentials(console: Console, recipe: Recipe, path: Path, report: ValidationReport) -> None:
    """A two-column summary of the resolved recipe (models as the recipe writes them)."""
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    algorithm, trainer, ray = recipe.algorithm, recipe.trainer, recipe.ray
    kl_terms = [name for name, on in (("in reward", algorithm.kl.use_in_reward), ("loss", algorithm.kl.use_kl_loss)) if on]
    actor = recipe.sections.roles.actor
    lora = " + LoRA" if actor is not None and actor.lora is not None else ""
    pools = "; ".join(
        f"{pool.name}: {pool.world_size} rank(s){' GPU' if pool.use_gpu else ''} [{', '.join(pool.roles)}]"
        for pool in report.pools.values() if pool.roles
    )
    tasks = [f"{entry['name']} x{entry.get('weight', 1)}" for entry in recipe.data.tasks or []]  # data.tasks: a mixture
    data = f"files {list(recipe.data.train_files)}" if recipe.data.train_files else f"task {recipe.data.task or ' + '.join(tasks)}"
    rows = stage_rows(recipe, path, pools, data) if recipe.stage is not None else [
        ("recipe", str(path)),
        ("model", _model(actor.model) + lora),
        ("algorithm", f"{algorithm.adv_estimator}; KL {', '.join(kl_terms) or 'off'}"),
        ("pools", pools),
        ("data", data),
        ("batch", f"{trainer.batch_size} prompts x n={recipe.rollout.settings.n} = "
                  f"{trainer.batch_size * recipe.rollout.settings.n} samples/step"),
        ("rollout", _rollout(recipe)),
        ("steps", str(trainer.total_steps)),
        ("backend", ray.backend + (f" @ {ray.address}" if ray.address else "")),
        ("output", str(trainer.output_dir)),
    ]
    written = {role: recipe.section_of(role).model for role in recipe.roles}  # as written: no fallback model
    trusted = [role for role, model in written.items() if model is not None and model.trust_remote_code]
    if trusted:
        rows.append(("remote code", f"trust_remote_code is ON for {', '.join(trusted)}: the model repository's own Python "
                                    "code will run in the worker processes"))
    if ray.dashboard:
        rows.append(("dashboard", "Ray dashboard on, bound to 127.0.0.1"))
    for key, value in rows:
        table.add_row(key, Text(value, style="bold yellow" if key == "remote code" else ""))
    console.print(table)


def _rollout(recipe: Recipe) -> str:
    """The engine, and with a rollout group of its own, its pool and the staleness bound."""
    rollout = recipe.rollout
    text = f"engine {rollout.engine} (rollout.engine)"
    if rollout.on_own_pool:
        text += (f"; separate group on pool {rollout.pool}, at most {rollout.max_staleness} "
                 "version(s) stale (trainer.max_staleness)")
    return text


def _model(model: Any) -> str:
    """A role's model: its path and dtype, or its inline architecture."""
    if model is None:
        return "-"
    if model.path:
        return f"{model.path} ({model.dtype})"
    config = model.config or {}  # null: no inline architecture written
    sizes = ", ".join(f"{key}={config[key]}" for key in ("hidden_size", "num_hidden_layers") if key in config)
    return f"inline {config.get('model_type', '?')} ({sizes}), random weights"


# ---------------------------------------------------------------------------------- sft, reward_model, dpo
def _algorithm(recipe: Recipe, name: str) -> str:
    algorithm = recipe.algorithm
    if name == "sft":
        return "sft: next-token loss on response tokens" + (", packed" if recipe.data.packing else "")
    if name == "reward_model":
        return f"reward_model: Bradley-Terry loss, margin {algorithm.margin:g}"
    source = {"reference": "roles.reference", "actor": "the adapter-disabled actor"}.get(recipe.step.reference_source or "", "none")
    return f"dpo: beta {algorithm.beta:g}, reference {source}"


def _data(recipe: Recipe, data_line: str) -> str:
    data = recipe.data
    if data.val_files:
        held_out = f"eval on {list(data.val_files)}"
    elif data.train_files:
        held_out = f"eval on {data.eval_fraction:g} held out" if data.eval_fraction else "no eval"
    else:
        held_out = f"eval on {data.num_val} generated" if data.num_val else "no eval"
    return f"{data_line}; {held_out}; max_length {data.max_length}"


def stage_rows(recipe: Recipe, path: Path, pools: str, data_line: str) -> list[tuple[str, str]]:
    """(label, value) rows: recipe, trained model, algorithm, pools, data, batch, steps, backend, output."""
    name = str(recipe.stage)
    role = STAGES[name].trained_role
    section = recipe.section_of(role)  # as written: the model a stage trains, without the fallback architecture
    lora = " + LoRA" if section is not None and section.get("lora") is not None else ""  # only the actor has lora
    output = str(recipe.trainer.output_dir)
    ray = recipe.ray
    return [
        ("recipe", str(path)),
        ("model", f"roles.{role}: {_model(section.model if section is not None else None)}{lora}"),
        ("algorithm", _algorithm(recipe, name)),
        ("pools", pools),
        ("data", _data(recipe, data_line)),
        ("batch", f"{recipe.trainer.batch_size} {_UNITS[name]}/step"),
        ("steps", str(recipe.trainer.total_steps)),
        ("backend", ray.backend + (f" @ {ray.address}" if ray.address else "")),
        ("output", f"{output} (model -> {Path(output) / 'model'})"),
    ]
