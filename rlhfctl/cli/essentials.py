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

from rlhfctl.recipe.validate import ValidationReport
from rlhfctl.recipe.resolve import reference_source, rollout_on_own_pool
from rlhfctl.recipe.stages import STAGES, is_stage

__all__ = ["render_essentials", "stage_rows"]

_UNITS = {"sft": "demonstrations", "reward_model": "preference pairs", "dpo": "preference pairs"}


def render_essentials(console: Console, cfg: Any, path: Path, report: ValidationReport) -> None:
    """A two-column summary of the resolved recipe."""
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    algorithm = cfg.algorithm
    kl_terms = [name for name, on in (("in reward", algorithm.kl.use_in_reward), ("loss", algorithm.kl.use_kl_loss)) if on]
    lora = " + LoRA" if (cfg.roles.get("actor") or {}).get("lora") is not None else ""
    pools = "; ".join(
        f"{pool.name}: {pool.world_size} rank(s){' GPU' if pool.use_gpu else ''} [{', '.join(pool.roles)}]"
        for pool in report.pools.values() if pool.roles
    )
    data = f"files {list(cfg.data.train_files)}" if cfg.data.train_files else f"task {cfg.data.task}"
    rows = stage_rows(cfg, path, pools, data) if is_stage(cfg) else [
        ("recipe", str(path)),
        ("model", _model(cfg.roles.actor.model) + lora),
        ("algorithm", f"{algorithm.adv_estimator}; KL {', '.join(kl_terms) or 'off'}"),
        ("pools", pools),
        ("data", data),
        ("batch", f"{cfg.trainer.batch_size} prompts x n={cfg.rollout.n} = {cfg.trainer.batch_size * cfg.rollout.n} samples/step"),
        ("rollout", _rollout(cfg)),
        ("steps", str(cfg.trainer.total_steps)),
        ("backend", cfg.ray.backend + (f" @ {cfg.ray.address}" if cfg.ray.address else "")),
        ("output", str(cfg.trainer.output_dir)),
    ]
    trusted = [role for role in ("actor", "reference", "critic", "reward")
               if cfg.roles.get(role) is not None and (cfg.roles[role].get("model") or {}).get("trust_remote_code")]
    if trusted:
        rows.append(("remote code", f"trust_remote_code is ON for {', '.join(trusted)}: the model repository's own Python "
                                    "code will run in the worker processes"))
    if cfg.ray.get("dashboard"):
        rows.append(("dashboard", "Ray dashboard on, bound to 127.0.0.1"))
    for key, value in rows:
        table.add_row(key, Text(value, style="bold yellow" if key == "remote code" else ""))
    console.print(table)


def _rollout(cfg: Any) -> str:
    """The engine, and with a rollout group of its own, its pool and the staleness bound."""
    rollout = cfg.rollout
    text = f"engine {rollout.get('engine', 'hf')} (rollout.engine)"
    if rollout_on_own_pool(rollout):
        text += (f"; separate group on pool {rollout.get('pool')}, at most {cfg.trainer.get('max_staleness', 0)} "
                 "version(s) stale (trainer.max_staleness)")
    return text


def _model(model: Any) -> str:
    """A role's model: its path and dtype, or its inline architecture."""
    if model is None:
        return "-"
    if model.get("path"):
        return f"{model.path} ({model.dtype})"
    config = model.get("config") or {}
    sizes = ", ".join(f"{key}={config[key]}" for key in ("hidden_size", "num_hidden_layers") if key in config)
    return f"inline {config.get('model_type', '?')} ({sizes}), random weights"


# ---------------------------------------------------------------------------------- sft, reward_model, dpo
def _algorithm(cfg: Any, name: str) -> str:
    algorithm = cfg.algorithm
    if name == "sft":
        return "sft: next-token loss on response tokens" + (", packed" if cfg.data.packing else "")
    if name == "reward_model":
        return f"reward_model: Bradley-Terry loss, margin {algorithm.margin:g}"
    source = {"reference": "roles.reference", "actor": "the adapter-disabled actor"}.get(reference_source(cfg) or "", "none")
    return f"dpo: beta {algorithm.beta:g}, reference {source}"


def _data(cfg: Any, data_line: str) -> str:
    data = cfg.data
    if data.val_files:
        held_out = f"eval on {list(data.val_files)}"
    elif data.train_files:
        held_out = f"eval on {data.eval_fraction:g} held out" if data.eval_fraction else "no eval"
    else:
        held_out = f"eval on {data.num_val} generated" if data.num_val else "no eval"
    return f"{data_line}; {held_out}; max_length {data.max_length}"


def stage_rows(cfg: Any, path: Path, pools: str, data_line: str) -> list[tuple[str, str]]:
    """(label, value) rows: recipe, trained model, algorithm, pools, data, batch, steps, backend, output."""
    name = str(cfg.algorithm.name)
    role = STAGES[name].trained_role
    section = cfg.roles.get(role)
    lora = " + LoRA" if section is not None and section.get("lora") is not None else ""
    output = str(cfg.trainer.output_dir)
    return [
        ("recipe", str(path)),
        ("model", f"roles.{role}: {_model(section.get('model') if section is not None else None)}{lora}"),
        ("algorithm", _algorithm(cfg, name)),
        ("pools", pools),
        ("data", _data(cfg, data_line)),
        ("batch", f"{cfg.trainer.batch_size} {_UNITS[name]}/step"),
        ("steps", str(cfg.trainer.total_steps)),
        ("backend", cfg.ray.backend + (f" @ {cfg.ray.address}" if cfg.ray.address else "")),
        ("output", f"{output} (model -> {Path(output) / 'model'})"),
    ]
