"""Pre-launch checks that look outside the recipe text: data files, the reward function, models, this machine.

``validate`` (and ``train``, before Ray starts) runs these after the recipe-only checks, so a recipe that
validates starts. Each check calls the code the run itself calls, never a second copy of it:

- data: the first :data:`SAMPLE_RECORDS` records of each file through :func:`rlhfctl.data.load_records`,
  the prompt lookup of :func:`rlhfctl.data.prompts.prompt_of` and the chat-template rule of
  :func:`rlhfctl.data.verl_layout.prompt_messages`; what was read becomes a
  :class:`rlhfctl.data.summary.DataFileSummary` per file (validate's data table);
- the reward function: :func:`rlhfctl.rewards.functions.load_reward_function` (the dot form
  ``pkg.module.fn`` is rejected here as at run time) and the call the reward worker makes, checked
  against the sampled columns (:func:`rlhfctl.data.verl_layout.reward_columns`, ``ground_truth`` lifted from
  ``reward_model.ground_truth``) by :func:`rlhfctl.rewards.functions.reward_call_problem`; a function that
  needs ``ground_truth`` against each file whose sampled rows have none;
- inline model configs: :func:`rlhfctl.models.loading.unknown_config_keys`, which ``build_config``
  also enforces; model paths: a local directory, or a hub id in the local Hugging Face cache, or a
  reachable hub (one bounded probe);
- pools: the CPUs the private Ray would have to give (what :class:`RayResourcePool` reserves) against
  this machine.

Checks that depend on this machine are warnings when the recipe is plainly meant for another one (its
pools need GPUs this machine does not show), and the machine check is skipped with a note when the run
joins a cluster (``ray.address``).
"""

from __future__ import annotations

import functools
import inspect
import os
import socket
import threading
from typing import Any
from urllib.parse import urlparse

from rlhfctl.data.records import SUPPORTED_EXTENSIONS, count_records
from rlhfctl.data.summary import DataFileSummary, summarize_sample
from rlhfctl.data.verl_layout import GROUND_TRUTH, NESTED_GROUND_TRUTH, prompt_messages, reward_columns
from rlhfctl.recipe.check_reward_names import first_training_record, named_reward_problems
from rlhfctl.recipe.errors import Issue, error, warning
from rlhfctl.recipe.pools import PoolInfo, pool_shares
from rlhfctl.recipe.schema import RayConfig
from rlhfctl.recipe.specs import Recipe
from rlhfctl.rewards.functions import (CONVERSATION_COLUMNS, RewardFunctionError, conversation_columns_taken,
                                      is_internal_column, load_reward_function, reward_call_problem)
from rlhfctl.single_controller.resource_pool import RayResourcePool
from rlhfctl.tasks import UnknownTaskError, get_task

__all__ = ["SAMPLE_RECORDS", "preflight", "sample_columns"]

SAMPLE_RECORDS = 64
"""Records read from the start of each data file; validate stays fast on large files."""

_HUB_PROBE_S = 2.0


def preflight(recipe: Recipe, pools: dict[str, PoolInfo], roles: list[str]) -> tuple[list[Issue], list[DataFileSummary]]:
    """Every pre-launch finding for ``roles`` started on ``pools`` (a stage starts only some of the recipe's roles),
    and what was read of each data file (data and reward only for rollout recipes)."""
    issues: list[Issue] = []
    summaries: list[DataFileSummary] = []
    if recipe.stage is None:
        columns, summaries, data_issues = sample_columns(recipe)
        issues += data_issues
        issues += _check_reward(recipe, columns, summaries)
    here = _meant_for_this_machine(recipe.ray, pools)
    issues += _check_models(recipe, roles, here)
    if here:
        issues += _check_machine(recipe.ray, pools)
    return issues, summaries


# ---------------------------------------------------------------------------------- data
def sample_columns(recipe: Recipe) -> tuple[dict[str, list[str]], list[DataFileSummary], list[Issue]]:
    """Per data source (``data.train_files``, ``data.val_files`` or ``data.task``), the columns its sampled
    records give the reward function; a summary of each file read; errors for records that do not parse, lack
    the prompt, or have a prompt ``data.apply_chat_template`` cannot render."""
    # the data package pulls in torch: only when the data is checked
    from rlhfctl.data import DataFileError, load_records
    from rlhfctl.data.prompts import prompt_of

    data = recipe.data
    prompt_key, chat = str(data.prompt_key), data.apply_chat_template
    found: dict[str, list[str]] = {}
    summaries = []
    issues = []
    for split in ("train_files", "val_files"):
        names: dict[str, None] = {}
        for index, name in enumerate(data[split] or []):
            key = f"data.{split}[{index}]"
            if not _readable(str(name)):
                continue  # check_data reports missing files and unsupported types
            try:
                records = load_records(str(name), limit=SAMPLE_RECORDS)
                for number, record in enumerate(records, start=1):
                    prompt_messages(prompt_of(record, prompt_key, str(name), number), chat, str(name), number)
                    names.update(dict.fromkeys(str(column) for column in reward_columns(record, prompt_key)))
            except DataFileError as failure:
                issues.append(error(key, f"{key}: {failure}"))
                continue
            summaries.append(summarize_sample(key, str(name), records, prompt_key, chat, count_records(str(name))))
        if names:
            found[f"data.{split}"] = [name for name in names if not is_internal_column(name)]
    if not data.train_files and data.task:
        found["data.task"] = _task_columns(recipe, prompt_key)
    return found, summaries, issues


def _readable(name: str) -> bool:
    path = os.path.expanduser(name)
    return os.path.isfile(path) and os.path.splitext(path)[1].lower() in SUPPORTED_EXTENSIONS


def _task_columns(recipe: Recipe, prompt_key: str) -> list[str]:
    try:
        records = get_task(str(recipe.data.task)).make_prompts(2, int(recipe.trainer.seed))
    except UnknownTaskError:
        return []  # check_data reports it
    names = dict.fromkeys(str(column) for record in records for column in reward_columns(record, prompt_key))
    return [name for name in names if not is_internal_column(name)]


# ---------------------------------------------------------------------------------- reward function
def _check_reward(recipe: Recipe, columns: dict[str, list[str]], summaries: list[DataFileSummary]) -> list[Issue]:
    """The reward spec loads as the worker loads it, and the function takes the call the worker makes."""
    reward = recipe.section_of("reward")
    if reward is None or not reward.function or reward.get("remote") is not None:  # remote: the service scores
        return []
    key = "roles.reward.function"
    try:
        function = load_reward_function(str(reward.function))
    except (RewardFunctionError, SystemExit) as failure:  # user code may call sys.exit() when imported
        text = str(failure) if isinstance(failure, RewardFunctionError) else f"importing it called sys.exit({failure})"
        return [error(key, text if text.startswith(key) else f"{key}: {text}")]
    missing = _ground_truth_problems(function, summaries)
    if missing:
        return missing
    kwargs = dict(reward.function_kwargs)
    # an agent rollout passes the conversation's columns the function names (as the reward worker does)
    added = conversation_columns_taken(function, CONVERSATION_COLUMNS) if recipe.rollout.agent else []
    for source, names in columns.items():
        problem = reward_call_problem(function, [*names, *added], kwargs=kwargs)
        if problem:
            sample = f"the first {SAMPLE_RECORDS} records of {source}" if source != "data.task" else source
            return [error(key, f"{key}: {problem}; columns read from {sample}")]
    sections = recipe.sections
    return named_reward_problems(sections, function, first_training_record(sections), str(recipe.data.prompt_key))


def _ground_truth_problems(function: Any, summaries: list[DataFileSummary]) -> list[Issue]:
    """An error per data file whose sampled rows give no ground truth (or only nulls) when ``function`` has a
    required ``ground_truth`` parameter."""
    try:
        parameter = inspect.signature(function).parameters.get(GROUND_TRUTH)
    except (TypeError, ValueError):
        return []  # a builtin or extension callable: nothing to read
    if parameter is None or parameter.default is not parameter.empty or parameter.kind in (
            parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
        return []
    name = getattr(function, "__name__", type(function).__name__)
    issues = []
    for summary in summaries:
        if summary.ground_truth_rows:
            continue
        if summary.ground_truth_keys:
            lack = (f"ground_truth is null in each of the first {summary.sampled} rows (read from "
                    f"{summary.ground_truth}), and roles.reward.function {name} needs it; fill it in")
        else:
            lack = (f"none of the first {summary.sampled} rows has a ground_truth (no '{GROUND_TRUTH}' column, no "
                    f"{NESTED_GROUND_TRUTH}), and roles.reward.function {name} needs it; give each row a "
                    f"'{GROUND_TRUTH}' column or, where verl's preprocessed data keeps it, "
                    f"reward_model: {{ground_truth: ...}}")
        issues.append(error(summary.key, f"{summary.key}: {summary.path}: {lack}"))
    return issues


# ---------------------------------------------------------------------------------- models
def _check_models(recipe: Recipe, roles: list[str], here: bool) -> list[Issue]:
    """Inline config keys the config class knows; paths that can load on this machine."""
    issues = []
    for role in roles:
        section = recipe.section_of(role).model  # as written: a role without its own model loads nothing new
        if section is None:
            continue
        model = dict(section)
        if model.get("config") is not None and not model.get("path"):
            issues += _config_keys(role, model)
        for field in ("path", "tokenizer_path"):
            problem = _unavailable(str(model[field])) if model.get(field) else None
            if problem:
                key = f"roles.{role}.model.{field}"
                issues.append((error if here else warning)(key, f"{key}: {problem}"))
    return issues


def _config_keys(role: str, model: dict[str, Any]) -> list[Issue]:
    # transformers: only for an inline model config
    from rlhfctl.models.loading import ModelConfigError, inline_config_class, unknown_config_keys

    prefix = f"roles.{role}.model.config"
    try:
        name = inline_config_class(model).__name__
        unknown = unknown_config_keys(model)
    except ModelConfigError as failure:
        return [error(f"{prefix}.model_type", f"{prefix}.model_type: {failure}")]
    return [error(f"{prefix}.{key}", (
        f"{prefix}.{key}: {name} has no field {key!r}{hint} (transformers would keep it as an unused attribute "
        "and build the default size)"
    )) for key, hint in unknown]


def _unavailable(source: str) -> str | None:
    """Why ``source`` cannot load here: not a local path, not in the local Hugging Face cache, hub unreachable."""
    if os.path.exists(os.path.expanduser(source)) or source.startswith((".", "/", "~")):
        return None  # local (a missing local path is check_models' error)
    # huggingface_hub: only for a hub model id
    from huggingface_hub import constants
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(source)
    except HFValidationError:
        return f"{source!r} is not a local path (relative to {os.getcwd()}) and not a hub id such as 'org/name'"
    cache = os.path.join(constants.HF_HUB_CACHE, "models--" + source.replace("/", "--"), "snapshots")
    if os.path.isdir(cache) and os.listdir(cache):
        return None
    offline = bool(constants.HF_HUB_OFFLINE)
    if not offline and _hub_reachable(constants.ENDPOINT):
        return None
    why = "HF_HUB_OFFLINE is set" if offline else f"{constants.ENDPOINT} cannot be reached"
    return (
        f"{source!r} is not a local directory and not in the Hugging Face cache ({constants.HF_HUB_CACHE}), "
        f"and {why}; download it where the hub is reachable (huggingface-cli download {source}) or give a "
        "local directory"
    )


@functools.cache
def _hub_reachable(endpoint: str) -> bool:
    """One TCP connect to the hub, bounded by _HUB_PROBE_S (DNS included), cached for the process."""
    url = urlparse(endpoint)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=_HUB_PROBE_S).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(_HUB_PROBE_S)
    return bool(result and result[0])


# ---------------------------------------------------------------------------------- this machine
def _joining(ray: RayConfig) -> bool:
    return bool(ray.address or os.environ.get("RAY_ADDRESS"))


def _meant_for_this_machine(ray: RayConfig, pools: dict[str, PoolInfo]) -> bool:
    """False when the pools need GPUs this machine lacks and no ray.num_gpus says otherwise (validated elsewhere)."""
    gpus = sum(pool.gpus for pool in pools.values() if pool.roles and not pool.in_driver)
    if not gpus or ray.num_gpus is not None or _joining(ray):
        return True
    try:
        import torch  # heavy: only when the pools want GPUs

        visible = int(torch.cuda.device_count())
    except Exception:  # noqa: BLE001 - no usable torch/CUDA: nothing to compare against
        return True
    return gpus <= visible


def _check_machine(ray: RayConfig, pools: dict[str, PoolInfo]) -> list[Issue]:
    """The CPUs the pools reserve fit the private Ray this machine starts (ray.num_cpus is checked elsewhere)."""
    started = [pool for pool in pools.values() if pool.roles and not pool.in_driver]
    if ray.backend == "local" or not started:
        return []
    if _joining(ray):
        return [warning("ray.address", (
            "ray.address: joining a cluster, so the pools are not checked against this machine; Ray places "
            "them when the run starts"
        ))]
    if ray.num_cpus is not None:
        return []
    reserved = {pool.name: pool.world_size * float(RayResourcePool(
        list(pool.process_on_nodes), pool.use_gpu, pool.max_colocate_count, pool.name, pool.num_cpus_per_process,
    ).num_cpus_per_process) for pool in started}  # type: ignore[arg-type]
    total, machine = sum(reserved.values()), _machine_cpus()
    if total <= machine:
        return []
    largest = max(reserved, key=reserved.__getitem__)
    key = f"resource_pools.{largest}.process_on_nodes"
    shares = pool_shares(started, lambda pool: reserved[pool.name])
    return [error(key, (
        f"{key}: the pools reserve {total:g} CPUs ({shares}: processes x num_cpus_per_process) but this machine "
        f"has {machine}, so the private Ray cannot place them; use fewer processes, a smaller "
        "resource_pools.<pool>.num_cpus_per_process, or join a cluster with ray.address"
    ))]


def _machine_cpus() -> int:
    """The CPUs a private Ray counts on this machine (container quotas included)."""
    try:
        from ray._private.utils import get_num_cpus  # ray: only when the pools are checked against this machine

        return int(get_num_cpus())
    except Exception:  # noqa: BLE001 - Ray's private helper moved: count the CPUs this process may use
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
