"""Tasks from reasoning-gym: ``data.task: reasoning_gym:<dataset>[?key=value&...]`` (``pip install 'rlhfctl[reasoning-gym]'``).

reasoning-gym (https://github.com/open-thought/reasoning-gym) generates verifiable problems procedurally:
``create_dataset(name, seed=, size=, **config)`` gives entries ``{"question", "answer", "metadata"}`` and
the dataset's ``score_answer(answer, entry)`` scores an answer in [0, 1]. A task name picks a dataset and
its config, the query's values read as YAML scalars or flow lists::

    reasoning_gym:leg_counting?min_animals=1&max_animals=3
    reasoning_gym:basic_arithmetic?max_terms=2&max_digits=1&operators=[+]

Each record's prompt is the question followed by :data:`INSTRUCTION`, which asks for the answer between
``<answer>`` and ``</answer>``; :func:`score` extracts it with reasoning-gym's own ``extract_answer`` (the
last tagged answer; None without one) and scores it with the dataset's ``score_answer`` for that entry.
Records carry ``data_source`` ``reasoning_gym/<dataset>`` (per-source metrics), ``ground_truth`` (the
entry's answer) and, in the column :data:`ENTRY_COLUMN`, a JSON-safe reference to the entry (dataset,
config, seed, size, index) from which the reward regenerates it: generation is deterministic per seed.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlhfctl.errors import UserError
from rlhfctl.tasks.reward_fn import check_reward_inputs
from rlhfctl.tasks.task_query import TaskQueryError, parse_query, split_name

__all__ = [
    "ENTRY_COLUMN",
    "INSTALL_HINT",
    "INSTRUCTION",
    "NAME_FORM",
    "PREFIX",
    "DatasetSpec",
    "ReasoningGymTaskError",
    "answer_text",
    "entry_of",
    "extract_answer",
    "is_reasoning_gym_name",
    "make_demonstrations",
    "make_prompts",
    "name_problem",
    "parse_name",
    "prompt_text",
    "score",
]

PREFIX = "reasoning_gym:"
"""Task names that start with this name a reasoning-gym dataset."""

NAME_FORM = r"reasoning_gym:[A-Za-z0-9_]+(\?.*)?"
"""The form of a reasoning-gym task name, a regular expression that the JSON Schema's pattern of task names joins
with the others (:func:`rlhfctl.tasks.task_name_pattern`); whether the dataset exists is checked on load."""

INSTALL_HINT = "pip install 'rlhfctl[reasoning-gym]'"

INSTRUCTION = "Give only the final answer, between <answer> and </answer>."
"""The line after each question: the answer format :func:`score` reads (reasoning-gym's own tags)."""

ENTRY_COLUMN = "reasoning_gym"
"""The record column holding ``{"dataset", "config", "seed", "size", "index"}``: where the entry comes from."""

_SET_BY_RLHFCTL = {"seed": "trainer.seed", "size": "data.num_train / data.num_val"}


class ReasoningGymTaskError(UserError, ValueError):
    """A reasoning-gym task name that cannot be used: malformed, an unknown dataset, a bad config, or no package."""


@dataclass(frozen=True)
class DatasetSpec:
    """A parsed task name: the reasoning-gym dataset and the config keys the query sets."""

    dataset: str
    config: Mapping[str, Any]

    @property
    def data_source(self) -> str:
        """The records' ``data_source``: ``reasoning_gym/<dataset>``, what per-source metrics are named by."""
        return f"reasoning_gym/{self.dataset}"


def is_reasoning_gym_name(name: str) -> bool:
    """Whether ``name`` is meant as a reasoning-gym task (starts with ``reasoning_gym:``)."""
    return isinstance(name, str) and name.startswith(PREFIX)


def parse_name(name: str) -> DatasetSpec:
    """``reasoning_gym:<dataset>[?key=value&...]`` -> DatasetSpec; ReasoningGymTaskError when malformed."""
    if not is_reasoning_gym_name(name):
        raise ReasoningGymTaskError(f"{name!r} is not a reasoning-gym task name ({PREFIX}<dataset>[?key=value&...])")
    dataset, query = split_name(name[len(PREFIX):])
    if not dataset:
        raise ReasoningGymTaskError(f"{name!r} names no dataset; write {PREFIX}<dataset>, e.g. {PREFIX}leg_counting")
    try:
        config = parse_query(name, query)
    except TaskQueryError as failure:
        raise ReasoningGymTaskError(str(failure)) from None
    for key in config:
        if key in _SET_BY_RLHFCTL:
            raise ReasoningGymTaskError(f"{name!r}: {key!r} is set by rlhfctl ({_SET_BY_RLHFCTL[key]}); remove it from the query")
    return DatasetSpec(dataset, config)


def _datasets() -> Mapping[str, tuple[type, type]]:
    """reasoning-gym's registry (name -> (dataset class, config class)), imported on first use."""
    try:
        from reasoning_gym.factory import DATASETS  # importing the package registers every dataset (~2 s)
    except ImportError:
        raise ReasoningGymTaskError(f"reasoning-gym tasks need the reasoning-gym package: {INSTALL_HINT}") from None
    return DATASETS


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be used as a reasoning-gym task (malformed, the package missing, an unknown dataset,
    an unknown or invalid config key), or None."""
    try:
        spec = parse_name(name)
        registry = _datasets()
    except ReasoningGymTaskError as failure:
        return str(failure)
    if spec.dataset not in registry:
        close = difflib.get_close_matches(spec.dataset, list(registry), n=5, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else f"; {len(registry)} datasets, e.g. {', '.join(sorted(registry)[:5])}"
        return f"{name!r}: reasoning-gym has no dataset {spec.dataset!r}{hint}"
    return _config_problem(name, spec, registry[spec.dataset][1])


def _config_problem(name: str, spec: DatasetSpec, config_cls: type) -> str | None:
    known = [item.name for item in dataclasses.fields(config_cls) if item.name not in _SET_BY_RLHFCTL]
    unknown = [key for key in spec.config if key not in known]
    if unknown:
        return f"{name!r}: {spec.dataset} has no config key {unknown[0]!r}; its keys: {', '.join(known)}"
    try:
        _create(spec, seed=0, size=1)
    except Exception as failure:  # the config class's validate() asserts; constructors raise what they raise
        return f"{name!r}: reasoning-gym rejects the config of {spec.dataset}: {failure or type(failure).__name__}"
    return None


def _create(spec: DatasetSpec, seed: int, size: int) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(spec.dataset, seed=seed, size=size, **dict(spec.config))


@functools.lru_cache(maxsize=64)
def _dataset(dataset: str, config_json: str, seed: int, size: int) -> Any:
    """One generated dataset, kept per process: the reward regenerates entries from it batch after batch."""
    return _create(DatasetSpec(dataset, json.loads(config_json)), seed, size)


def _reference(spec: DatasetSpec, seed: int, size: int, index: int) -> dict[str, Any]:
    return {"dataset": spec.dataset, "config": dict(spec.config), "seed": seed, "size": size, "index": index}


def _dataset_of(reference: Mapping[str, Any]) -> Any:
    config_json = json.dumps(dict(reference["config"]), sort_keys=True)
    return _dataset(str(reference["dataset"]), config_json, int(reference["seed"]), int(reference["size"]))


def entry_of(reference: Mapping[str, Any]) -> dict[str, Any]:
    """The reasoning-gym entry a record's :data:`ENTRY_COLUMN` points at (regenerated, the same for a seed)."""
    return _dataset_of(reference)[int(reference["index"])]


def prompt_text(question: str) -> str:
    """The prompt of an entry: its question, then the line asking for the answer between tags."""
    return f"{question.rstrip()}\n{INSTRUCTION}"


def _check(num: int) -> None:
    if num < 0:
        raise ValueError(f"num must be a non-negative number of records, got {num}")


def _entries(spec: DatasetSpec, num: int, seed: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(entry, reference) for the first ``num`` entries of the dataset generated with ``seed``."""
    _check(num)
    if num == 0:
        return []
    dataset = _dataset(spec.dataset, json.dumps(dict(spec.config), sort_keys=True), seed, num)
    return [(dataset[index], _reference(spec, seed, num, index)) for index in range(num)]


def make_prompts(spec: DatasetSpec, num: int, seed: int) -> list[dict[str, Any]]:
    """``num`` records ``{"prompt", "ground_truth", "data_source", "reasoning_gym"}``, the same for a seed."""
    return [
        {"prompt": prompt_text(entry["question"]), "ground_truth": str(entry["answer"]),
         "data_source": spec.data_source, ENTRY_COLUMN: reference}
        for entry, reference in _entries(spec, num, seed)
    ]


def answer_text(answer: Any) -> str:
    """A response in the format the prompt asks for: ``<answer>8</answer>``."""
    return f"<answer>{answer}</answer>"


def make_demonstrations(spec: DatasetSpec, num: int, seed: int) -> list[dict[str, Any]]:
    """``num`` sft records: :func:`make_prompts`' records with ``response`` the entry's answer between tags."""
    return [{**record, "response": answer_text(record["ground_truth"])} for record in make_prompts(spec, num, seed)]


def extract_answer(response: str) -> str | None:
    """The answer a response gives: reasoning-gym's ``extract_answer`` (the last ``<answer>...</answer>``, stripped)."""
    from reasoning_gym.utils import extract_answer as extract

    return extract(response)


def score(prompts: list[str], responses: list[str], reasoning_gym: list[Mapping[str, Any]],
          ground_truth: list[Any] | None = None, **columns: Any) -> list[dict[str, float]]:
    """Per sample ``{"score", "acc"}``: the dataset's ``score_answer`` of the extracted answer for the record's
    entry, and 1.0 when that score is 1 (a response without tags scores what ``score_answer(None, entry)`` gives)."""
    truths = ground_truth if ground_truth is not None else [None] * len(responses)
    check_reward_inputs(prompts, responses, reasoning_gym=reasoning_gym, ground_truth=truths, **columns)
    results = []
    for response, reference, truth in zip(responses, reasoning_gym, truths):
        dataset = _dataset_of(reference)
        entry = dataset[int(reference["index"])]
        if truth is not None and str(entry["answer"]) != str(truth):
            raise ValueError(
                f"reasoning-gym {reference['dataset']} regenerated entry {reference['index']} with answer "
                f"{entry['answer']!r}, but the record's ground_truth is {truth!r}: its generation is not deterministic per seed"
            )
        value = float(dataset.score_answer(extract_answer(response), entry))
        results.append({"score": value, "acc": 1.0 if value == 1.0 else 0.0})
    return results
