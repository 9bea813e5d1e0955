"""Validation of ``rollout.engine: vllm``: vllm importable, the actor's architecture supported by vLLM.

Runs before any worker starts, so a missing extra or a model family vLLM cannot run is exit 2.
"""

from __future__ import annotations

import json
import os
from typing import Any

from rlhfctl.recipe.report import Issue, error, warning

__all__ = ["check_rollout_engine"]

# Used when vllm is not importable here (the error then is the missing extra; this only names the family).
_KNOWN_ARCHITECTURES = frozenset({"Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
                                  "GPT2LMHeadModel", "GPTNeoXForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM"})
# vLLM's CPU attention kernels (vllm.v1.attention.backends.cpu_attn) take these head sizes only.
_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def check_rollout_engine(cfg: Any) -> list[Issue]:
    """Errors for ``rollout.engine: vllm`` without vllm, with an unsupported model, or on the local backend."""
    rollout = cfg.rollout
    if rollout.get("engine", "hf") != "vllm":
        if rollout.get("importance_cap") is not None:
            return [warning("rollout.importance_cap", "rollout.importance_cap: has no effect with rollout.engine: hf "
                            "(the actor samples and scores with the same weights and code)")]
        return []
    from workers.sampling.vllm_engine import VLLM_INSTALL_HINT, vllm_installed

    if not vllm_installed():
        return [error("rollout.engine", f"rollout.engine: vllm needs the vllm package, which does not import here; {VLLM_INSTALL_HINT}")]
    issues = []
    actor = cfg.roles.get("actor")
    if actor is not None:
        issues += _check_architecture(actor, _uses_gpu(cfg, actor), str(rollout.vllm.log_level))
    if cfg.ray.backend == "local":
        issues.append(error("ray.backend", "ray.backend: local runs every rank in the driver process, but rollout.engine: "
                            "vllm runs one engine in each actor rank's own process; use ray.backend: ray"))
    return issues


def _uses_gpu(cfg: Any, actor: Any) -> bool:
    pool = cfg.resource_pools.get(str(actor.pool))
    return bool(pool is not None and pool.use_gpu)


def _model_fields(model: Any) -> tuple[str, dict[str, Any]] | None:
    """(key path, config fields) of the actor's model: the inline config, or a local path's config.json."""
    path = model.get("path")
    if path:
        config_file = os.path.join(os.path.expanduser(str(path)), "config.json")
        if not os.path.isfile(config_file):
            return None  # a hub id or a missing path: from_pretrained (or check_models) speaks for it
        with open(config_file, encoding="utf-8") as handle:
            return "roles.actor.model.path", json.load(handle)
    from workers.recipe import DEFAULT_INLINE_MODEL

    config = model.get("config")
    return "roles.actor.model.config", dict(DEFAULT_INLINE_MODEL if config is None else config)


def _architecture(fields: dict[str, Any]) -> str | None:
    if fields.get("architectures"):
        return str(fields["architectures"][0])
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(fields.get("model_type") or "qwen2"))


def _supported_architectures(log_level: str) -> frozenset[str]:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", log_level)  # vLLM logs on import; keep it out of the display
    try:
        from vllm.model_executor.models import ModelRegistry

        return frozenset(ModelRegistry.get_supported_archs())
    except Exception:  # noqa: BLE001 - a vllm that imports partly: fall back to the families we know work
        return _KNOWN_ARCHITECTURES


def _check_architecture(actor: Any, gpu: bool, log_level: str) -> list[Issue]:
    found = _model_fields(actor.get("model") or {})
    if found is None:
        return []
    key, fields = found
    architecture = _architecture(fields)
    if architecture is None or architecture not in _supported_architectures(log_level):
        return [error(key, f"{key}: rollout.engine: vllm cannot run the model family {architecture or fields.get('model_type')!r}: "
                      "vLLM's model registry does not list it; use rollout.engine: hf or a supported family such as qwen2 or llama")]
    heads = fields.get("num_attention_heads")
    head_dim = fields.get("head_dim") or (int(fields["hidden_size"]) // int(heads) if heads and fields.get("hidden_size") else None)
    if not gpu and head_dim is not None and int(head_dim) not in _CPU_HEAD_SIZES:
        return [error(key, f"{key}: vLLM's CPU attention takes head sizes {', '.join(map(str, _CPU_HEAD_SIZES))}, and this model's "
                      f"is {head_dim} (hidden_size / num_attention_heads); e.g. halve num_attention_heads and num_key_value_heads")]
    return []
