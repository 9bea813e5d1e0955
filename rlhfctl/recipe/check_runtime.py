"""Validation: what any recipe needs to start: pools that fit the Ray settings, worker classes with the
methods the trainer calls, data files, model paths and positions, a resume path that exists, strategies,
token budgets and the rollout engine."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterable
from typing import Any

from rlhfctl.recipe.check_paths import data_file_issues, model_path_issues, resume_issues
from rlhfctl.recipe.errors import Issue, RecipeError, did_you_mean, error, warning
from rlhfctl.recipe.importing import import_class
from rlhfctl.recipe.pools import DRIVER_POOL, PoolInfo, pool_shares
from rlhfctl.recipe.resolve import resolve_strategy
from rlhfctl.recipe.resolved import DEFAULT_INLINE_MODEL
from rlhfctl.recipe.schema import RayConfig
from rlhfctl.recipe.specs import Recipe
from rlhfctl.single_controller.resource_pool import RayResourcePool
from rlhfctl.tasks import UnknownTaskError, get_task

__all__ = [
    "LOGGER_EXTRAS",
    "LOGGER_NAMES",
    "check_data",
    "check_loggers",
    "check_model",
    "check_models",
    "check_pools",
    "check_resume",
    "check_rollout_engine",
    "check_strategies",
    "check_token_budgets",
    "check_workers",
    "listed_loggers",
    "longest_row",
    "unregistered_methods",
    "worker_classes",
]

def check_pools(recipe: Recipe) -> list[Issue]:
    """Errors for undeclared pools and resources the Ray settings cannot give; a warning for a pool no role uses."""
    declared = [str(name) for name in recipe.resource_pools]
    issues = []
    if DRIVER_POOL in declared:
        issues.append(error(f"resource_pools.{DRIVER_POOL}", (
            f"resource_pools.{DRIVER_POOL}: the name {DRIVER_POOL!r} is reserved for a reward function run in the "
            "driver process (roles.reward.pool: driver); rename this pool"
        )))
    for role, spec in recipe.roles.items():
        pool = spec.pool
        if pool == DRIVER_POOL:
            issues += _driver_role(recipe, role)
        elif pool not in declared:
            key = f"roles.{role}.pool"
            issues.append(error(key, (
                f"{key}: pool {pool!r} is not declared in resource_pools (declared: {', '.join(declared)})"
                f"{did_you_mean(pool, declared)}"
            )))
    for pool in recipe.pools.values():
        if not pool.roles:
            issues.append(warning(f"resource_pools.{pool.name}", f"resource_pools.{pool.name}: no role uses this pool; it is not started"))
    return issues + _resources(recipe.ray, [pool for pool in recipe.pools.values() if pool.roles and not pool.in_driver])


def _driver_role(recipe: Recipe, role: str) -> list[Issue]:
    """Only a reward function may run in the driver: models and training roles need worker processes."""
    key = f"roles.{role}.pool"
    if role != "reward":
        return [error(key, (
            f"{key}: only roles.reward can run in the driver (pool: {DRIVER_POOL}); {role} needs a pool "
            "declared in resource_pools"
        ))]
    if recipe.section_of(role).model is not None:
        return [error(key, (
            f"{key}: a reward model needs a pool declared in resource_pools; pool: {DRIVER_POOL} is for a reward "
            f"function (roles.{role}.function or data.task)"
        ))]
    return []


def _cpus_per_process(pool: PoolInfo) -> float:
    ray_pool = RayResourcePool(list(pool.process_on_nodes), pool.use_gpu, pool.max_colocate_count, pool.name, pool.num_cpus_per_process)
    return float(ray_pool.num_cpus_per_process)  # type: ignore[arg-type]


def _resources(ray_cfg: RayConfig, pools: list[PoolInfo]) -> list[Issue]:
    issues = []
    if ray_cfg.backend == "local":
        multi = [pool.name for pool in pools if pool.world_size > 1]
        if multi:
            issues.append(warning("ray.backend", (
                f"ray.backend: local runs every rank in this process, without torch.distributed across ranks; "
                f"pools with several ranks: {', '.join(multi)}"
            )))
        return issues
    joining = bool(ray_cfg.address or os.environ.get("RAY_ADDRESS"))
    gpus = sum(pool.gpus for pool in pools)
    cpus = sum(pool.world_size * _cpus_per_process(pool) for pool in pools)
    if not joining and ray_cfg.num_cpus is not None and cpus > ray_cfg.num_cpus:
        shares = pool_shares(pools, lambda pool: pool.world_size * _cpus_per_process(pool))
        issues.append(error("ray.num_cpus", f"ray.num_cpus: the pools reserve {cpus:g} CPUs ({shares}) but the local Ray gets {ray_cfg.num_cpus}"))
    if not joining and ray_cfg.num_gpus is not None and gpus > ray_cfg.num_gpus:
        shares = pool_shares(pools, lambda pool: pool.gpus)
        issues.append(error("ray.num_gpus", f"ray.num_gpus: the pools need {gpus} GPUs ({shares}) but the local Ray gets {ray_cfg.num_gpus}"))
    elif not joining and gpus:
        visible = _visible_gpus()
        if visible is not None and gpus > visible:
            issues.append(warning("resource_pools", (
                f"resource_pools: the pools need {gpus} GPU(s) ({pool_shares(pools, lambda pool: pool.gpus)}) and this machine shows {visible}; "
                "fine when joining a cluster (ray.address), otherwise the run cannot start"
            )))
    return issues


def _visible_gpus() -> int | None:
    try:
        import torch  # heavy: only when the pools want GPUs

        return int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - no usable torch/CUDA: nothing to compare against
        return None


def check_models(recipe: Recipe) -> list[Issue]:
    """Errors for local model paths that do not exist and inline configs too short for prompt + response."""
    prompt, response, key = rollout_row(recipe)
    needed, label = prompt + response, f"data.max_prompt_length + {key}"
    issues = []
    for role in recipe.roles:
        model = recipe.section_of(role).model  # as written: a reference or critic on the actor's model is not checked twice
        if model is not None:
            issues += check_model(role, model, needed, label)
    return issues


def rollout_row(recipe: Recipe) -> tuple[int, int, str]:
    """A rollout row's prompt tokens, its response width, and the recipe key that gives the width."""
    key = "rollout.multi_turn.max_response_tokens" if recipe.rollout.agent else "rollout.max_new_tokens"
    return int(recipe.data.max_prompt_length), recipe.rollout.response_width, key


def check_model(role: str, model: Any, needed_positions: int, needed_by: str) -> list[Issue]:
    """One role's model: local paths that do not exist, and inline configs with too few positions."""
    issues = model_path_issues(role, model)
    config = model.get("config")
    limit = config.get("max_position_embeddings") if config is not None and not model.get("path") else None
    if isinstance(limit, int) and limit < needed_positions:
        key = f"roles.{role}.model.config.max_position_embeddings"
        issues.append(error(key, f"{key}: {limit} positions cannot hold {needed_by} = {needed_positions}"))
    return issues


def check_resume(recipe: Recipe) -> list[Issue]:
    """An error when trainer.resume names a checkpoint path that does not exist."""
    return resume_issues(recipe)


# ---------------------------------------------------------------------------------- worker classes and the reward function
def worker_classes(recipe: Recipe) -> dict[str, type]:
    """Import each configured role's worker class; RecipeError (naming roles.<role>.worker) on failure."""
    return {role: import_class(spec.worker, f"roles.{role}.worker") for role, spec in recipe.roles.items()}


def unregistered_methods(recipe: Recipe, role: str, needed: Iterable[str]) -> tuple[type, list[str]]:
    """The role's worker class and which of ``needed`` it does not register; RecipeError when it does not import."""
    from rlhfctl.single_controller.decorator import registered_methods  # pulls in torch: off the CLI's fast path

    cls = import_class(recipe.role(role).worker, f"roles.{role}.worker")
    registered = registered_methods(cls)
    return cls, [name for name in needed if name not in registered]


def check_workers(recipe: Recipe) -> list[Issue]:
    """Errors for worker classes that do not import or lack registered methods."""
    from rlhfctl.single_controller.decorator import registered_methods  # pulls in torch: off the CLI's fast path

    issues = []
    for role, spec in recipe.roles.items():
        key = f"roles.{role}.worker"
        try:
            cls, missing = unregistered_methods(recipe, role, spec.methods)
        except RecipeError as failure:
            issues.append(error(key, str(failure)))
            continue
        if not missing:
            continue
        registered = registered_methods(cls)
        plain = [name for name in missing if callable(getattr(cls, name, None))]
        why = f" ({', '.join(plain)} defined but not decorated with @register)" if plain else ""
        need = "as the reference (LoRA actor, no reference role)" if "compute_ref_log_prob" in missing and role == "actor" else f"as the {role}"
        issues.append(error(key, (
            f"{key}: {cls.__module__}.{cls.__qualname__} lacks registered method(s) {', '.join(missing)} needed {need}{why}; "
            f"registered: {', '.join(registered) or 'none'}"
        )))
    return issues


# ---------------------------------------------------------------------------------- data
def check_data(recipe: Recipe) -> list[Issue]:
    """Errors for missing or unsupported data files; warnings for settings that are ignored."""
    data = recipe.data
    issues = data_file_issues(data)
    if data.train_files and data.task:
        issues.append(warning("data.task", f"data.task: {data.task!r} is ignored because data.train_files is set"))
    if not data.train_files and data.task:
        issues.extend(_check_task(recipe))
    if recipe.trainer.val_every and not data.val_files and not data.task and not data.tasks:
        issues.append(warning("trainer.val_every", "trainer.val_every: validation is on but there is no validation data (data.val_files)"))
    return issues


def _check_task(recipe: Recipe) -> list[Issue]:
    issues = []
    data = recipe.data
    if data.num_train < recipe.trainer.batch_size:
        issues.append(error("data.num_train", (
            f"data.num_train: {data.num_train} prompts is fewer than trainer.batch_size ({recipe.trainer.batch_size})"
        )))
    try:
        task = get_task(str(data.task))
    except UnknownTaskError as failure:
        return [*issues, error("data.task", f"data.task: {failure}")]
    reward = recipe.section_of("reward")
    task_fn = f"{task.score.__module__}:{task.score.__name__}"
    if reward is not None and reward.function and reward.function != task_fn and reward.model is None:
        issues.append(warning("roles.reward.function", (
            f"roles.reward.function: {reward.function} scores the responses, not the {data.task!r} task's own reward {task_fn}"
        )))
    return issues


def check_strategies(recipe: Recipe) -> list[Issue]:
    """Errors for ``roles.<role>.strategy`` on a role without a model, and ``fsdp.cpu_offload``,
    ``param_offload`` or ``optimizer_offload`` without fsdp2."""
    issues = []
    for role, spec in recipe.roles.items():
        section = spec.settings
        strategy = section.strategy
        if role == "reward" and spec.model is None and not section.get("judge"):  # a reward function (the reward_model stage trains a model)
            if strategy is not None:
                key = f"roles.{role}.strategy"
                issues.append(error(key, (
                    f"{key}: {strategy} places a model across ranks, but roles.{role} scores with a reward function "
                    f"(no roles.{role}.model); remove the strategy or set roles.{role}.model"
                )))
            continue
        world = spec.world_size if spec.world_size is not None else 1  # the driver, or an undeclared pool: one rank
        effective = spec.strategy if spec.strategy is not None else resolve_strategy(strategy, world)
        for option in ("cpu_offload", "param_offload", "optimizer_offload"):
            if section.fsdp[option] and effective != "fsdp2":
                key = f"roles.{role}.fsdp.{option}"
                why = f"roles.{role}.strategy is {strategy}" if strategy else f"the role has {world} rank, so its strategy is ddp"
                what = {"cpu_offload": "CPU offload", "param_offload": "Parameter offload",
                        "optimizer_offload": "Optimizer offload"}[option]
                issues.append(error(key, f"{key}: {what} needs strategy fsdp2, but {why}; set roles.{role}.strategy: fsdp2"))
    return issues


# ---------------------------------------------------------------------------------- token budgets
# A PPO row is a prompt plus a response, at most data.max_prompt_length + rollout.max_new_tokens tokens;
# an sft row at most data.max_length; a reward_model or dpo row is a pair (chosen and rejected), at most
# 2 x data.max_length. A roles.<role>.micro_batch_tokens budget smaller than that could never fit the row.
_BUDGETED_ROLES = ("actor", "critic", "reward")


def longest_row(recipe: Recipe) -> tuple[int, str]:
    """The most tokens one training row can hold, and how that follows from the recipe."""
    data, name = recipe.data, str(recipe.algorithm.name)
    if name == "sft":
        return int(data.max_length), f"data.max_length {int(data.max_length)}"
    if name in ("reward_model", "dpo"):
        return 2 * int(data.max_length), f"a pair, 2 x data.max_length {int(data.max_length)}"
    prompt, response, key = rollout_row(recipe)
    return prompt + response, f"data.max_prompt_length {prompt} + {key} {response}"


def check_token_budgets(recipe: Recipe) -> list[Issue]:
    """An error per role whose micro_batch_tokens is smaller than the longest row."""
    longest, why = longest_row(recipe)
    issues = []
    for role, spec in recipe.roles.items():
        budget = spec.settings.micro_batch_tokens if role in _BUDGETED_ROLES else None
        if budget is not None and int(budget) < longest:
            key = f"roles.{role}.micro_batch_tokens"
            issues.append(error(key, (
                f"{key}: {int(budget)} is smaller than one sequence ({longest} tokens = {why}); "
                f"set it to at least {longest}, or null to form micro-batches by micro_batch_size rows"
            )))
    return issues


# ---------------------------------------------------------------------------------- rollout engine
# rollout.engine: vllm is checked before any worker starts, so a missing extra, a vLLM older than the sync
# needs (rlhfctl.rollout.vllm_engine.VLLM_MIN_VERSION) or a model family vLLM cannot run is exit 2.
# Used when vllm is not importable here (the error then is the missing extra; this only names the family).
_KNOWN_ARCHITECTURES = frozenset({"Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
                                  "GPT2LMHeadModel", "GPTNeoXForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM"})
# vLLM's CPU attention kernels (vllm.v1.attention.backends.cpu_attn) take these head sizes only.
_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def check_rollout_engine(recipe: Recipe) -> list[Issue]:
    """Errors for ``rollout.engine: vllm`` without vllm, with a vLLM too old, an unsupported model, or on the local backend.

    Where the recipe's pools need more GPUs than this machine shows, the workers run elsewhere (a cluster) and vllm
    must import there, not here: a missing vllm is then a warning, so a GPU recipe validates on a machine
    without it."""
    rollout = recipe.rollout
    if rollout.engine != "vllm":
        # A rollout group of its own, or rollout.dtype apart from the actor's, returns behaviour log-probs; the
        # colocated hf actor in its own precision does not.
        if rollout.settings.importance_cap is not None and not rollout.engine_log_probs:
            return [warning("rollout.importance_cap", "rollout.importance_cap: has no effect with rollout.engine: hf "
                            "(the actor samples and scores with the same weights and code)")]
        return []
    from rlhfctl.rollout import vllm_engine  # pulls in torch: only for rollout.engine: vllm

    if not vllm_engine.vllm_installed():
        message = f"rollout.engine: vllm needs the vllm package, which does not import here; {vllm_engine.VLLM_INSTALL_HINT}"
        needed = sum(pool.gpus for pool in recipe.pools.values() if pool.use_gpu)
        visible = _visible_gpus() or 0
        if needed > visible:
            return [warning("rollout.engine", f"{message}; a warning here, where the pools' {needed} GPU(s) are not "
                                              f"({visible} visible): install vllm where the workers run")]
        return [error("rollout.engine", message)]
    too_old = vllm_engine.vllm_version_problem()
    if too_old is not None:  # the sync would fail inside every actor rank instead
        return [error("rollout.engine", too_old)]
    issues = []
    actor = recipe.roles.get("actor")
    if actor is not None:
        issues += _check_architecture(actor.model, _uses_gpu(recipe, actor.pool), str(rollout.vllm.log_level))
    if recipe.ray.backend == "local":
        issues.append(error("ray.backend", "ray.backend: local runs every rank in the driver process, but rollout.engine: "
                            "vllm runs one engine in each actor rank's own process; use ray.backend: ray"))
    return issues


def _uses_gpu(recipe: Recipe, actor_pool: str) -> bool:
    """Whether the engine runs on a GPU pool: the rollout group's with placement separate, else the actor's."""
    pool = recipe.pools.get(recipe.rollout.pool or actor_pool)
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
    config = model.get("config")
    return "roles.actor.model.config", dict(DEFAULT_INLINE_MODEL if config is None else config)


def _architecture(fields: dict[str, Any]) -> str | None:
    if fields.get("architectures"):
        return str(fields["architectures"][0])
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # heavy: vllm recipes only

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(str(fields.get("model_type") or "qwen2"))


def _supported_architectures(log_level: str) -> frozenset[str]:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", log_level)  # vLLM logs on import; keep it out of the display
    try:
        from vllm.model_executor.models import ModelRegistry  # heavy: vllm recipes only

        return frozenset(ModelRegistry.get_supported_archs())
    except Exception:  # noqa: BLE001 - a vllm that imports partly: fall back to the families we know work
        return _KNOWN_ARCHITECTURES


def _check_architecture(model: Any, gpu: bool, log_level: str) -> list[Issue]:
    found = _model_fields(model)
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


# ---------------------------------------------------------------------------------- loggers
# trainer.loggers: the names a recipe may list, the extra each optional one needs, and the check before launch.
#: The loggers a recipe may list, in the order they are written.
LOGGER_NAMES: tuple[str, ...] = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
#: logger -> (module it imports, the pip extra that installs it)
LOGGER_EXTRAS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}


def check_loggers(recipe: Recipe) -> list[Issue]:
    """Errors for unknown names in ``trainer.loggers`` and for loggers whose package is not installed."""
    names = list(listed_loggers(recipe))
    issues = []
    for position, name in enumerate(names):
        key = f"trainer.loggers[{position}]"
        if name not in LOGGER_NAMES:
            issues.append(error(key, f"{key}: {name!r} is not one of: {', '.join(LOGGER_NAMES)}"))
        elif name in LOGGER_EXTRAS and importlib.util.find_spec(LOGGER_EXTRAS[name][0]) is None:
            module, extra = LOGGER_EXTRAS[name]
            issues.append(error(key, f"{key}: the {name} logger needs the {module!r} package, which is not installed; "
                                     f"pip install 'rlhfctl[{extra}]' or remove {name} from trainer.loggers"))
    return issues


def listed_loggers(cfg: Any) -> list[str]:
    """The names in ``trainer.loggers`` of a merged recipe (or its plain dict); null lists none."""
    trainer = cfg["trainer"] if isinstance(cfg, dict) else cfg.trainer
    return [str(name) for name in trainer.get("loggers") or []]
