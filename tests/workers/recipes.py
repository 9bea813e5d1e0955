"""Tiny recipes and prompt batches shared by the worker tests (inline models only: no downloads)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from rlhfctl.models.loading import load_tokenizer
from rlhfctl.protocol import DataProto
from rlhfctl.tasks import digits

TINY_MODEL: dict[str, Any] = {
    "config": {
        "model_type": "qwen2",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    }
}


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def tiny_recipe(**changes: Any) -> dict[str, Any]:
    """A resolved recipe dict with a tiny qwen2 actor; ``changes`` are merged in (nested dicts merge)."""
    recipe: dict[str, Any] = {
        "trainer": {"seed": 0, "total_steps": 10, "ppo_epochs": 1, "mini_batch_size": None, "batch_size": 4},
        "rollout": {"n": 2, "max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "do_sample": True},
        "algorithm": {"kl": {"use_kl_loss": False, "loss_coef": 0.001, "loss_kind": "k3"}},
        "resource_pools": {"global": {"use_gpu": False}},
        "data": {"task": "digits"},
        "roles": {
            "actor": {"model": copy.deepcopy(TINY_MODEL), "optim": {"lr": 1e-2}},
            "reward": {"function": "rlhfctl.tasks.digits:score"},
        },
    }
    return _merge(recipe, changes)


def tokenizer():
    """The character tokenizer the tiny inline model uses (left padding)."""
    return load_tokenizer(TINY_MODEL)


def digits_prompts(num: int = 4, seed: int = 0, **meta_info: Any) -> DataProto:
    """``num`` left-padded prompts of the bundled digits task, with uid/prompt_text/ground_truth columns."""
    records = digits.make_prompts(num, seed)
    texts = [record["prompt"] for record in records]
    encoded = tokenizer()(texts, padding=True, return_tensors="pt")
    return DataProto.from_dict(
        tensors={"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]},
        non_tensors={
            "uid": np.asarray([f"p{i}" for i in range(num)], dtype=object),
            "prompt_text": texts,
            "ground_truth": [record["ground_truth"] for record in records],
        },
        meta_info=meta_info,
    )


def left_padded_prompt_ids(rows: int, width: int, padding: dict[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random prompt ids (rows, width) and their mask, with ``padding[row]`` padding positions on the left."""
    ids = torch.randint(5, 60, (rows, width), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    for row, count in padding.items():
        mask[row, :count] = 0
    return ids, mask
