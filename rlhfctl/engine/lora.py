"""LoRA adapters on the actor (peft): apply, switch off for reference log-probs, save/load, merge."""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from rlhfctl.recipe.schema import LoraConfig as LoraSection
from rlhfctl.recipe.schema import defaults_of

__all__ = ["ADAPTER_FILES", "adapter_disabled", "apply_lora", "is_lora", "load_adapter", "merged_copy", "save_adapter"]

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def apply_lora(model: nn.Module, lora: Mapping[str, Any], seed: int) -> nn.Module:
    """Wrap a causal LM in a peft LoRA model (adapter weights initialised from ``seed``)."""
    from peft import LoraConfig, get_peft_model  # peft: only with LoRA, off the CLI's fast path

    settings = {**defaults_of(LoraSection), **{key: value for key, value in dict(lora).items() if value is not None}}
    targets = settings["target_modules"]
    if not isinstance(targets, str):
        targets = [str(name) for name in targets]
    config = LoraConfig(
        r=int(settings["r"]),
        lora_alpha=settings["alpha"],
        lora_dropout=float(settings["dropout"]),
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft asks transformers about gradient checkpointing through a since-renamed property.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def is_lora(model: nn.Module) -> bool:
    """True for a peft model (the unwrapped actor module with an adapter)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


@contextlib.contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run the base model: the adapter is switched off inside the block."""
    if not is_lora(model):
        raise TypeError("adapter_disabled needs a peft model")
    with model.disable_adapter():
        yield model


def save_adapter(model: nn.Module, directory: str | os.PathLike[str]) -> None:
    """Write the adapter only (``adapter_config.json`` + ``adapter_model.safetensors``)."""
    model.save_pretrained(str(directory), safe_serialization=True)


def load_adapter(model: nn.Module, directory: str | os.PathLike[str], device: torch.device) -> None:
    """Load adapter weights written by :func:`save_adapter` into ``model``'s active adapter."""
    from peft import load_peft_weights, set_peft_model_state_dict  # peft: only with LoRA

    weights = load_peft_weights(str(directory), device=str(device))
    result = set_peft_model_state_dict(model, weights)
    missing = [key for key in getattr(result, "missing_keys", []) if "lora_" in key]
    unexpected = list(getattr(result, "unexpected_keys", []))
    if missing or unexpected:
        raise RuntimeError(
            f"adapter in {directory} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )


def merged_copy(model: nn.Module) -> nn.Module:
    """A plain transformers model with the adapter merged in; ``model`` is left untouched."""
    return copy.deepcopy(model).merge_and_unload()
