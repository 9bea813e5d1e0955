"""The essentials lines of an sft, reward_model or dpo recipe (``rlhfctl train`` prints them before a run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhfctl.recipe.roles import reference_source
from rlhfctl.recipe.stages import STAGES

__all__ = ["stage_rows"]

_UNITS = {"sft": "demonstrations", "reward_model": "preference pairs", "dpo": "preference pairs"}


def _model(model: Any) -> str:
    if model is None:
        return "-"
    if model.get("path"):
        return f"{model.path} ({model.dtype})"
    config = model.get("config") or {}
    sizes = ", ".join(f"{key}={config[key]}" for key in ("hidden_size", "num_hidden_layers") if key in config)
    return f"inline {config.get('model_type', '?')} ({sizes}), random weights"


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
