"""Recipe builders for tests: a small valid recipe on the stub workers, written to a temp file."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

STUB = "tests.recipe.stub_workers"

BASE_RECIPE: dict[str, Any] = {
    "resource_pools": {"main": {"process_on_nodes": [2]}},
    "roles": {
        "actor": {
            "worker": f"{STUB}.StubActor",
            "pool": "main",
            "model": {"config": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
                                 "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 128}},
        },
        "reference": {"worker": f"{STUB}.StubReference", "pool": "main"},
        "critic": None,
        "reward": {"worker": f"{STUB}:StubReward", "pool": "main", "function": f"{STUB}:reward_fn"},
    },
    "data": {"task": "digits"},
    "rollout": {"n": 4, "max_new_tokens": 32},
    "algorithm": {"adv_estimator": "grpo", "kl": {"use_kl_loss": True}},
    "trainer": {"total_steps": 2, "batch_size": 16, "mini_batch_size": 16, "output_dir": "runs/test"},
}


def recipe_data(**sections: Any) -> dict[str, Any]:
    """A deep copy of BASE_RECIPE with top-level sections replaced."""
    data = copy.deepcopy(BASE_RECIPE)
    data.update(sections)
    return data


def write_recipe(folder: Path, data: dict[str, Any] | str, name: str = "recipe.yaml") -> Path:
    """Write a recipe (a dict dumped as YAML, or raw text) and return its path."""
    path = folder / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def validate_cli(recipe_file: Path, *overrides: str) -> Any:
    """``rlhfctl validate recipe_file overrides...`` through the CLI; the result, checked to hold no traceback."""
    from typer.testing import CliRunner

    from rlhfctl.cli import app

    result = CliRunner().invoke(app, ["validate", str(recipe_file), *overrides])
    assert "Traceback" not in result.output, result.output
    return result
