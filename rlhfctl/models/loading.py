"""Build tokenizers and models from a recipe's ``model`` section (a plain mapping).

A model section names its weights in one of two ways:

- ``path``: a local directory or a hub id, loaded with ``from_pretrained``;
- ``config``: an inline architecture, e.g. ``{model_type: qwen2, hidden_size: 64,
  num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 128}``, built with random
  weights and paired with the character tokenizer (:class:`CharTokenizer`). Vocabulary size and
  pad/eos/bos ids come from the tokenizer unless the config gives them.

Optional keys: ``tokenizer_path`` (load the tokenizer from elsewhere), ``chat_template`` (replace
the tokenizer's template), ``attn_implementation`` (passed to transformers). When both ``path``
and ``config`` are given, ``path`` wins: a model saved by :func:`save_hf_model` loads back through
``path`` even if the recipe still carries the inline ``config``. A directory the character tokenizer was saved
to (:func:`rlhfctl.models.tokenizer.is_char_tokenizer_dir`) loads it as :class:`CharTokenizer` again; the
``tokenizer.json`` saved beside it is for transformers without rlhfctl, and gives the same ids.

Random inline weights depend only on ``seed``: every rank, and the reference policy, build
identical weights from the same seed (initialise on CPU, then move).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.util
import inspect
import os
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from packaging import version
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PretrainedConfig,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING,
    MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING,
)

from rlhfctl.errors import UserError
from rlhfctl.local_paths import looks_local
from rlhfctl.models.tokenizer import CharTokenizer, is_char_tokenizer_dir

__all__ = [
    "VALUE_HEAD_FILE",
    "CausalLMWithValueHead",
    "ModelConfigError",
    "build_config",
    "cast_parameters",
    "inline_config_class",
    "load_causal_lm",
    "load_sequence_classifier",
    "load_token_value_model",
    "load_tokenizer",
    "resolve_dtype",
    "save_hf_model",
    "token_values",
    "trained_leaves",
    "unknown_config_keys",
]

_USES_DTYPE_KWARG = version.parse(transformers.__version__) >= version.parse("4.56")
_EXAMPLE_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral", "gpt2", "gpt_neox")
VALUE_HEAD_FILE = "value_head.safetensors"  # CausalLMWithValueHead's head, next to its backbone's files
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


class ModelConfigError(UserError, ValueError):
    """A recipe's ``model`` section cannot be turned into a tokenizer or model."""


# --------------------------------------------------------------------------- helpers


def _plain(value: Any) -> Any:
    """Deep-convert mappings/sequences (e.g. OmegaConf containers) to dicts and lists."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(item) for item in value]
    return value


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | str | None:
    """Accept ``torch.bfloat16``, ``"bf16"``, ``"bfloat16"``, ``"auto"`` or None from recipes."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).lower().removeprefix("torch.")
    if name == "auto":
        return "auto"
    if name not in _DTYPES:
        raise ModelConfigError(f"unknown dtype {dtype!r}; use one of {sorted(set(_DTYPES))} or 'auto'")
    return _DTYPES[name]


def _dtype_kwargs(dtype: torch.dtype | str | None) -> dict[str, Any]:
    """transformers renamed ``torch_dtype`` to ``dtype`` in 4.56; pass whichever it expects."""
    dtype = resolve_dtype(dtype)
    if dtype is None:
        return {}
    return {"dtype": dtype} if _USES_DTYPE_KWARG else {"torch_dtype": dtype}


def _resolve_path(path: Any, what: str) -> str:
    """Expand ``~`` and fail early, with a useful message, on missing local paths."""
    text = os.path.expanduser(str(path))
    if looks_local(str(path)) and not os.path.exists(text):
        raise ModelConfigError(
            f"{what} {path!r} does not exist. Check the path (relative paths are resolved from "
            f"{os.getcwd()!r}), or give a hub id such as 'Qwen/Qwen2.5-0.5B-Instruct'."
        )
    return text


def _weights_path(model_cfg: Mapping[str, Any]) -> str | None:
    path = model_cfg.get("path")
    return None if path in (None, "") else _resolve_path(path, "model.path")


def _require_source(model_cfg: Mapping[str, Any]) -> None:
    if model_cfg.get("path") in (None, "") and model_cfg.get("config") is None:
        raise ModelConfigError(
            "the model section gives neither 'path' nor 'config': set model.path to a local "
            "directory or hub id, or model.config to an inline architecture such as "
            "{model_type: qwen2, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, "
            "intermediate_size: 128}."
        )
    if model_cfg.get("path") not in (None, "") and model_cfg.get("config") is not None:
        warnings.warn(
            "model.path and model.config are both set; loading weights from model.path and "
            "ignoring model.config.",
            stacklevel=3,
        )


def _safetensors_kwargs(path: str) -> dict[str, Any]:
    """Insist on safetensors when a local checkpoint has them; otherwise let transformers pick."""
    if os.path.isdir(path) and any(name.endswith(".safetensors") for name in os.listdir(path)):
        return {"use_safetensors": True}
    return {}


def _load_request(model_cfg: Mapping[str, Any], dtype: Any, trust_remote_code: bool) -> tuple[dict[str, Any], str | None]:
    """What every loader starts from: the from_pretrained keyword arguments, and the weights path (None: build
    from ``config``); a section with neither source is refused here."""
    _require_source(model_cfg)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, **_dtype_kwargs(dtype)}
    if model_cfg.get("attn_implementation"):
        kwargs["attn_implementation"] = model_cfg["attn_implementation"]
    return kwargs, _weights_path(model_cfg)


def _random_weights(make: Callable[..., nn.Module], config: PretrainedConfig, kwargs: Mapping[str, Any],
                    dtype: Any, seed: int | None) -> nn.Module:
    """``make(config, ...)`` with seeded random weights, then cast to ``dtype`` (from_config takes no dtype)."""
    kwargs = {key: value for key, value in kwargs.items() if key not in ("dtype", "torch_dtype")}
    with _seeded(seed):
        model = make(config, **kwargs)
    value = resolve_dtype(dtype)
    if value is not None and value != "auto":
        cast_parameters(model, value)
    return model


def cast_parameters(module: nn.Module, dtype: torch.dtype, frozen_dtype: torch.dtype | None = None) -> nn.Module:
    """Cast ``module``'s floating parameters to ``dtype`` in place, keeping its buffers as they are;
    with ``frozen_dtype``, parameters that do not train (``requires_grad`` False) take that dtype instead.

    ``frozen_dtype`` is how a LoRA actor keeps float32 masters for its adapter only: its frozen base
    stays in the compute dtype, as the memory plan counts it. ``module.to(dtype)`` would also cast
    floating buffers, such as the rotary embedding's ``inv_freq``: bf16 rounding of it turns into angle
    errors that grow with the position (about 0.6 rad at position 500 for rope_theta 1e6, head_dim 128).
    ``from_pretrained(dtype=...)`` keeps those buffers float32, and so does this. Tied parameters stay
    tied: each Parameter object keeps its identity.
    """
    with torch.no_grad():
        for parameter in module.parameters():
            target = dtype if frozen_dtype is None or parameter.requires_grad else frozen_dtype
            if parameter.is_floating_point() and parameter.dtype != target:
                parameter.data = parameter.data.to(target)
    return module


def trained_leaves(module: nn.Module, frozen_dtype: torch.dtype) -> list[nn.Module]:
    """The modules whose own parameters train in a dtype other than ``frozen_dtype``, when the model also has
    frozen parameters (a LoRA adapter's float32 ``lora_A`` / ``lora_B`` over a bf16 base); else none.

    FSDP2 derives one dtype per unit from its trainable parameters at its first forward. peft's
    ``disable_adapter`` (the reference pass) turns the adapter's ``requires_grad`` off, so a unit that mixed a
    bf16 base with a float32 adapter could take no dtype and later write bf16 gradients into float32
    masters: these modules become FSDP2 units of their own, each of one dtype.
    """
    parameters = list(module.parameters())
    if not any(not p.requires_grad and p.is_floating_point() and p.dtype == frozen_dtype for p in parameters):
        return []
    leaves = []
    for sub in module.modules():
        own = list(sub.parameters(recurse=False))
        if own and all(p.requires_grad and p.dtype != frozen_dtype for p in own):
            leaves.append(sub)
    return leaves


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Seed the CPU generator for the block, then restore the caller's generator state."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def _loading(what: str, source: Any) -> Iterator[None]:
    """transformers' OSError (files missing, hub unreachable) as a one-line ModelConfigError: a user error."""
    try:
        yield
    except OSError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise ModelConfigError(
            f"{what} {source!r} cannot be loaded: {lines[0] if lines else type(error).__name__}; give a local "
            "directory, or a hub id that is in the local Hugging Face cache or reachable"
        ) from None


def _set_pad_token_id(model: nn.Module, tokenizer: Any) -> None:
    """Models that pool the last token, and ``generate``, need the pad id on the config."""
    config = getattr(model, "config", None)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if config is None or pad_id is None:
        return
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = pad_id
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None and getattr(generation_config, "pad_token_id", None) is None:
        generation_config.pad_token_id = pad_id


def _has_head(config: PretrainedConfig, mapping: Any, auto_class: str) -> bool:
    if auto_class in (getattr(config, "auto_map", None) or {}):
        return True
    return type(config) in mapping


# --------------------------------------------------------------------------- tokenizer


def load_tokenizer(model_cfg: Mapping[str, Any], trust_remote_code: bool = False) -> Any:
    """Return the tokenizer a model section implies, left-padded and with a pad token set."""
    _require_source(model_cfg)
    source = model_cfg.get("tokenizer_path") or model_cfg.get("path")
    if source:
        where = "model.tokenizer_path" if model_cfg.get("tokenizer_path") else "model.path"
        location = _resolve_path(source, where)
        if is_char_tokenizer_dir(location):  # saved by CharTokenizer: rebuild it (tokenizer.json gives the same ids)
            tokenizer = CharTokenizer.from_pretrained(location)
        else:
            with _loading(where, source):
                tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code)
    else:
        tokenizer = CharTokenizer()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelConfigError(
                f"the tokenizer from {source!r} has neither a pad nor an eos token; set "
                "model.tokenizer_path to a tokenizer that defines one."
            )
        tokenizer.pad_token = tokenizer.eos_token
    if model_cfg.get("chat_template"):
        tokenizer.chat_template = str(model_cfg["chat_template"])
    return tokenizer


# --------------------------------------------------------------------------- configs


def build_config(model_cfg: Mapping[str, Any], tokenizer: Any) -> PretrainedConfig:
    """Turn an inline ``model.config`` into a transformers config that matches the tokenizer."""
    if model_cfg.get("config") is None:
        raise ModelConfigError(
            "build_config needs an inline model.config (a mapping with model_type and sizes); "
            "for a checkpoint use model.path instead."
        )
    fields = _plain(model_cfg["config"])
    if not isinstance(fields, dict):
        raise ModelConfigError(f"model.config must be a mapping of config fields, got {type(fields).__name__}")
    config_class = inline_config_class(model_cfg)
    model_type = fields.pop("model_type", None) or model_cfg.get("model_type")
    unknown = unknown_config_keys(model_cfg)
    if unknown:
        key, hint = unknown[0]
        raise ModelConfigError(f"model.config.{key}: {config_class.__name__} has no field {key!r}{hint}")
    vocab_needed = len(tokenizer)
    if fields.get("vocab_size") is not None and int(fields["vocab_size"]) < vocab_needed:
        raise ModelConfigError(
            f"model.config.vocab_size={fields['vocab_size']} is smaller than the tokenizer "
            f"({vocab_needed} tokens); remove vocab_size to take it from the tokenizer."
        )
    fields.setdefault("vocab_size", vocab_needed)
    fields.setdefault("pad_token_id", tokenizer.pad_token_id)
    fields.setdefault("eos_token_id", tokenizer.eos_token_id)
    fields.setdefault("bos_token_id", tokenizer.bos_token_id)
    if (
        "num_attention_heads" in fields
        and "num_key_value_heads" not in fields
        and "num_key_value_heads" in inspect.signature(config_class.__init__).parameters
    ):
        # Config defaults (often 32) exceed tiny head counts; default to plain multi-head attention.
        fields["num_key_value_heads"] = fields["num_attention_heads"]
    try:
        return AutoConfig.for_model(model_type, **fields)
    except (TypeError, ValueError) as error:
        raise ModelConfigError(f"model.config for {model_type!r} is invalid: {error}") from error


def inline_config_class(model_cfg: Mapping[str, Any]) -> type[PretrainedConfig]:
    """The transformers config class of an inline ``model.config``, from its model_type."""
    fields = model_cfg.get("config") or {}
    if not isinstance(fields, Mapping):
        raise ModelConfigError(f"model.config must be a mapping of config fields, got {type(fields).__name__}")
    model_type = fields.get("model_type") or model_cfg.get("model_type")
    if not model_type:
        raise ModelConfigError(f"model.config needs a model_type, e.g. one of {', '.join(_EXAMPLE_MODEL_TYPES)}.")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ModelConfigError(
            f"unknown model_type {model_type!r} in model.config; known types include "
            f"{', '.join(_EXAMPLE_MODEL_TYPES)} (see transformers' CONFIG_MAPPING for all)."
        )
    return CONFIG_MAPPING[model_type]


def unknown_config_keys(model_cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, "; did you mean ..." or "") for each inline ``model.config`` key its config class would only store.

    transformers keeps an unknown key as a plain attribute and builds the default architecture, so a typo
    (``hidden_sise``) silently trains a 4096-wide model. Known: the class's parameters and default
    attributes, its attribute_map, keys it consumes (legacy ``rope_theta``), and names its modeling code
    reads with ``getattr(config, ...)`` (``head_dim``).
    """
    config_class = inline_config_class(model_cfg)
    known = _known_config_keys(config_class)
    unknown = []
    for key, value in _plain(model_cfg.get("config") or {}).items():
        if key in known or key == "model_type" or _consumed(config_class, key, value):
            continue
        matches = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {matches[0]!r}?" if matches else f"; see {config_class.__name__} for the fields"
        unknown.append((key, hint))
    return unknown


def _known_config_keys(config_class: type[PretrainedConfig]) -> set[str]:
    known = {name for cls in config_class.__mro__ if "__init__" in vars(cls)
             for name in inspect.signature(cls.__init__).parameters}
    with contextlib.suppress(Exception):  # composite configs (encoder-decoder) need arguments to build
        default = config_class()  # what it stores and what it writes: a saved config.json is a valid inline config
        known |= set(vars(default)) | set(default.to_dict())
    known |= set(getattr(config_class, "attribute_map", {}) or {})
    return known | _modeling_reads(config_class.model_type)


def _modeling_reads(model_type: str) -> set[str]:
    """Config names the model's modeling module reads with getattr(config, "name", ...) (read as text)."""
    try:
        spec = importlib.util.find_spec(f"transformers.models.{model_type}.modeling_{model_type}")
    except (ImportError, ValueError):
        return set()
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return set()
    with open(spec.origin, encoding="utf-8") as handle:
        return set(re.findall(r"getattr\(\s*(?:self\.)?config\s*,\s*[\"'](\w+)[\"']", handle.read()))


def _consumed(config_class: type[PretrainedConfig], key: str, value: Any) -> bool:
    """True when the class takes ``key`` in (e.g. folds rope_theta into rope_parameters) rather than storing it."""
    try:
        return key not in vars(config_class(**{key: value}))
    except Exception:  # noqa: BLE001 - the class looked at the key and rejected its value: it knows the key
        return True


# --------------------------------------------------------------------------- models


def load_causal_lm(model_cfg: Mapping[str, Any], tokenizer: Any, *, dtype: torch.dtype | str | None = None,
                   trust_remote_code: bool = False, seed: int | None = None) -> nn.Module:
    """Load (``path``) or build with seeded random weights (``config``) the policy/reference LM."""
    kwargs, path = _load_request(model_cfg, dtype, trust_remote_code)
    if path is not None:
        with _loading("model.path", path):
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs, **_safetensors_kwargs(path))
    else:
        model = _random_weights(AutoModelForCausalLM.from_config, build_config(model_cfg, tokenizer), kwargs, dtype, seed)
    _set_pad_token_id(model, tokenizer)
    return model


def enable_activation_checkpointing(model: nn.Module, options: dict[str, Any] | None = None) -> None:
    """Recompute activations in the backward pass instead of keeping them (``model.gradient_checkpointing``).

    transformers 5 renamed ``gradient_checkpointing_enable`` to ``activation_checkpointing_enable`` and
    warns on the old name; older releases only have the old one. ``options`` default to the
    non-reentrant checkpoint.
    """
    options = options if options is not None else {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


class CausalLMWithValueHead(nn.Module):
    """Value model for architectures without a token-classification head: backbone + linear(1)."""

    def __init__(self, backbone: nn.Module, head: nn.Linear | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = _hidden_size(backbone.config)
        if head is None:
            head = nn.Linear(hidden, 1)
            head.to(dtype=next(backbone.parameters()).dtype)
        self.value_head = head

    @property
    def config(self) -> PretrainedConfig:
        """The backbone's config, so callers can treat this like a transformers model."""
        return self.backbone.config

    @classmethod
    def from_config(
        cls, config: PretrainedConfig, *, seed: int | None = None, **kwargs: Any
    ) -> CausalLMWithValueHead:
        """Random backbone and head from a config (seeded when ``seed`` is given)."""
        with _seeded(seed):
            backbone = AutoModel.from_config(config, **kwargs)
            return cls(backbone)

    @classmethod
    def from_pretrained(
        cls, directory: str | os.PathLike[str], *, seed: int | None = None, **kwargs: Any
    ) -> CausalLMWithValueHead:
        """Load a backbone checkpoint; load the head too if ``value_head.safetensors`` is there."""
        backbone = AutoModel.from_pretrained(directory, **kwargs)
        head_file = Path(directory) / VALUE_HEAD_FILE
        with _seeded(seed):
            model = cls(backbone)
        if head_file.is_file():
            state = load_file(str(head_file))
            model.value_head.load_state_dict(
                {key: tensor.to(model.value_head.weight.dtype) for key, tensor in state.items()}
            )
        return model

    def save_pretrained(
        self, directory: str | os.PathLike[str], state_dict: dict[str, torch.Tensor] | None = None, **kwargs: Any
    ) -> None:
        """Backbone as a transformers checkpoint plus the head in ``value_head.safetensors``; ``state_dict``
        (this module's full state, e.g. gathered from shards) replaces the module's own tensors."""
        os.makedirs(directory, exist_ok=True)
        if state_dict is None:
            self.backbone.save_pretrained(directory, **kwargs)
            head = self.value_head.state_dict()
        else:
            backbone = {key.removeprefix("backbone."): value for key, value in state_dict.items() if key.startswith("backbone.")}
            self.backbone.save_pretrained(directory, state_dict=backbone, **kwargs)
            head = {key.removeprefix("value_head."): value for key, value in state_dict.items() if key.startswith("value_head.")}
        state = {key: tensor.detach().cpu().contiguous() for key, tensor in head.items()}
        save_file(state, str(Path(directory) / VALUE_HEAD_FILE))

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict[str, Any] | None = None) -> None:
        """Forward to the backbone so workers can treat both value-model kinds alike."""
        enable_activation_checkpointing(self.backbone, activation_checkpointing_kwargs)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-token values, shape (batch, seq_len)."""
        outputs = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        hidden = outputs.last_hidden_state
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)


def _hidden_size(config: PretrainedConfig) -> int:
    for name in ("hidden_size", "n_embd", "d_model"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    raise ModelConfigError(f"cannot find the hidden size of a {type(config).__name__}; set hidden_size")


def token_values(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token values (B, T) from either kind of value model (also when wrapped by FSDP/DDP)."""
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    if isinstance(outputs, torch.Tensor):
        return outputs
    return outputs.logits[..., 0]


def load_token_value_model(model_cfg: Mapping[str, Any], tokenizer: Any, *, dtype: torch.dtype | str | None = None,
                           trust_remote_code: bool = False, seed: int | None = None) -> nn.Module:
    """The PPO critic: token classification with one label, or :class:`CausalLMWithValueHead`.

    Read values with :func:`token_values` (``.logits[..., 0]`` for the transformers head, the
    forward output itself for the fallback).
    """
    kwargs, path = _load_request(model_cfg, dtype, trust_remote_code)
    if path is not None:
        with _loading("model.path", path):
            model = _pretrained_value_model(path, seed, trust_remote_code, kwargs)
    else:
        config = build_config(model_cfg, tokenizer)
        config.num_labels = 1
        if _has_head(config, MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING, "AutoModelForTokenClassification"):
            make: Callable[..., nn.Module] = AutoModelForTokenClassification.from_config
        else:
            make = functools.partial(CausalLMWithValueHead.from_config, seed=seed)
        model = _random_weights(make, config, kwargs, dtype, seed)
    _set_pad_token_id(model, tokenizer)
    return model


def _pretrained_value_model(path: str, seed: int | None, trust_remote_code: bool, kwargs: dict[str, Any]) -> nn.Module:
    """A value model from a checkpoint: ours with its value head, a token classifier, or a backbone + new head."""
    if os.path.isfile(os.path.join(path, VALUE_HEAD_FILE)):
        return CausalLMWithValueHead.from_pretrained(path, seed=seed, **kwargs)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    if _has_head(config, MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING, "AutoModelForTokenClassification"):
        with _seeded(seed):
            return AutoModelForTokenClassification.from_pretrained(
                path, num_labels=1, ignore_mismatched_sizes=True, **kwargs, **_safetensors_kwargs(path)
            )
    return CausalLMWithValueHead.from_pretrained(path, seed=seed, **kwargs)


def load_sequence_classifier(model_cfg: Mapping[str, Any], tokenizer: Any, *, dtype: torch.dtype | str | None = None,
                             trust_remote_code: bool = False, seed: int | None = None) -> nn.Module:
    """A reward model: one scalar per sequence, read at the last non-pad token (logits (B, 1))."""
    kwargs, path = _load_request(model_cfg, dtype, trust_remote_code)
    if path is not None:
        with _loading("model.path", path):
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        _require_head(config, MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING, "AutoModelForSequenceClassification")
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = tokenizer.pad_token_id
        config.num_labels = 1
        with _seeded(seed), _loading("model.path", path):
            model = AutoModelForSequenceClassification.from_pretrained(
                path, config=config, **kwargs, **_safetensors_kwargs(path)
            )
    else:
        config = build_config(model_cfg, tokenizer)
        config.num_labels = 1
        _require_head(config, MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING, "AutoModelForSequenceClassification")
        model = _random_weights(AutoModelForSequenceClassification.from_config, config, kwargs, dtype, seed)
    _set_pad_token_id(model, tokenizer)
    return model


def _require_head(config: PretrainedConfig, mapping: Any, auto_class: str) -> None:
    if not _has_head(config, mapping, auto_class):
        raise ModelConfigError(
            f"model_type {config.model_type!r} has no {auto_class} head in transformers "
            f"{transformers.__version__}; pick an architecture that has one, e.g. "
            f"{', '.join(_EXAMPLE_MODEL_TYPES)}."
        )


# --------------------------------------------------------------------------- saving


def save_hf_model(
    model: nn.Module, tokenizer: Any, directory: str | os.PathLike[str], state_dict: dict[str, torch.Tensor] | None = None
) -> Path:
    """Write weights (safetensors) and tokenizer so the directory loads back via ``model.path``, and with plain
    transformers (the character tokenizer writes a ``tokenizer.json`` too: :mod:`rlhfctl.models.tokenizer`);
    ``state_dict`` (the full state, e.g. gathered from shards or cast for export) replaces the model's own."""
    target = Path(os.path.expanduser(str(directory)))
    target.mkdir(parents=True, exist_ok=True)
    if not hasattr(model, "save_pretrained"):
        raise TypeError(
            f"cannot save a {type(model).__name__}: unwrap it to the transformers model (or "
            "CausalLMWithValueHead) before calling save_hf_model."
        )
    if state_dict is None:
        model.save_pretrained(str(target))
    else:
        model.save_pretrained(str(target), state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(target))
    return target
