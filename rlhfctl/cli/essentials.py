"""The few settings worth seeing before a run starts: recipe, model, algorithm, pools, batch, output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlhfctl.cli.stage_essentials import stage_rows
from rlhfctl.recipe.report import ValidationReport
from rlhfctl.recipe.stages import is_stage

__all__ = ["render_essentials"]


def _model(cfg: Any) -> str:
    model = cfg.roles.actor.model
    if model.path:
        return f"{model.path} ({model.dtype})"
    config = model.config or {}
    sizes = ", ".join(f"{key}={config[key]}" for key in ("hidden_size", "num_hidden_layers") if key in config)
    return f"inline {config.get('model_type', '?')} ({sizes}), random weights"


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
        ("model", _model(cfg) + lora),
        ("algorithm", f"{algorithm.adv_estimator}; KL {', '.join(kl_terms) or 'off'}"),
        ("pools", pools),
        ("data", data),
        ("batch", f"{cfg.trainer.batch_size} prompts x n={cfg.rollout.n} = {cfg.trainer.batch_size * cfg.rollout.n} samples/step"),
        ("rollout", f"engine {cfg.rollout.get('engine', 'hf')} (rollout.engine)"),
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
