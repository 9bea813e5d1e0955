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


#: Qwen2.5-7B's config.json (the values that size the model); no download: the plan reads shapes only.
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-06, "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151643,
}
PARAMETERS_7B = 7_615_616_512
