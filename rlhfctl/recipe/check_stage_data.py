"""The records of a supervised stage's data files (sft demonstrations, reward_model and dpo preference pairs),
read and tokenized before anything starts.

The first :data:`rlhfctl.recipe.preflight.SAMPLE_RECORDS` records of each of ``data.train_files`` and
``data.val_files`` go through the stage's own dataset class
(:class:`rlhfctl.data.pairs.DemonstrationDataset` / :class:`~rlhfctl.data.pairs.PreferenceDataset`) with the
tokenizer the trained role loads, so what would stop the run when it builds its data stops validate instead:
a file that does not parse, a record without its columns (``data.prompt_key``, ``data.response_key``,
``data.chosen_key``, ``data.rejected_key``, a ``messages`` chat), an empty or non-text value, a chat template
asked for and missing, a record over ``data.max_length`` with ``data.overlong: error``.

The tokenizer comes from the trained role's model section (an inline ``model.config``: the built-in
character tokenizer; ``model.path`` / ``tokenizer_path``: a local directory or a hub id in the local cache).
A model that is not here yet (a pipeline's earlier stage's output) can be stood in for by the model section
that stage trains (``tokenizer_model``): that stage exports its tokenizer with the model.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from rlhfctl.recipe.errors import Issue, error, warning
from rlhfctl.recipe.example_prompt import has_tokenizer_files, local_directory
from rlhfctl.recipe.specs import Recipe
from rlhfctl.recipe.stages import STAGES

__all__ = ["check_stage_data", "trained_model"]


def trained_model(recipe: Recipe) -> dict[str, Any] | None:
    """The model section of the role the recipe trains (a stage's trained role, the actor for the PPO family), as
    written: what its exported model directory's tokenizer comes from (None: that role has no model)."""
    spec = STAGES.get(str(recipe.stage)) if recipe.stage is not None else None
    section = recipe.section_of(spec.trained_role if spec is not None else "actor")
    model = section.get("model") if section is not None else None
    return None if model is None else dict(model)


def check_stage_data(recipe: Recipe, tokenizer_model: Mapping[str, Any] | None = None) -> list[Issue]:
    """Errors for the sampled records of a supervised stage's data files, each naming the data key and the file
    (``tokenizer_model``: the model section to take the tokenizer from, default the trained role's)."""
    spec = STAGES.get(str(recipe.stage))
    files = [(f"data.{split}[{index}]", str(name)) for split in ("train_files", "val_files")
             for index, name in enumerate(_names(recipe.data[split]))]
    files = [(key, name) for key, name in files if os.path.exists(os.path.expanduser(name))]  # check_data: missing ones
    if spec is None or not files:
        return []
    model = dict(tokenizer_model) if tokenizer_model is not None else trained_model(recipe)
    tokenizer = _tokenizer(model) if model is not None else None
    if tokenizer is None:
        return []  # no model, or not here: check_stage and check_models say so
    return [issue for key, name in files for issue in _file_issues(recipe, spec.record_kind, tokenizer, key, name)]


def _names(value: Any) -> list[Any]:
    """A data key's files: a list, or one file as a string (as the stage reads it)."""
    return [value] if isinstance(value, str) else list(value or [])


def _tokenizer(model: dict[str, Any]) -> Any:
    """The tokenizer the run loads from ``model``, or None when it is not on this machine (or does not load:
    the model checks report that)."""
    from rlhfctl.models.loading import ModelConfigError, load_tokenizer  # transformers: only when a stage has data files

    field = "tokenizer_path" if model.get("tokenizer_path") else "path"
    if model.get(field):
        directory = local_directory(str(model[field]))
        if directory is None or not has_tokenizer_files(directory):
            return None
        model = {**model, field: directory}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # path and config both set: check_models' business
            return load_tokenizer(model, trust_remote_code=bool(model.get("trust_remote_code")))
    except (ModelConfigError, OSError, ValueError):
        return None


def _file_issues(recipe: Recipe, kind: str, tokenizer: Any, key: str, name: str) -> list[Issue]:
    """The first problem the stage's dataset finds in the file's sampled records (none: [])."""
    # the data package pulls in torch: only when a stage has data files
    from rlhfctl.data import DataConfigError, DataFileError, load_records
    from rlhfctl.data.pairs import DemonstrationDataset, PreferenceDataset
    from rlhfctl.recipe.preflight import SAMPLE_RECORDS

    dataset = DemonstrationDataset if kind == "demonstrations" else PreferenceDataset
    data = recipe.data
    records: list[dict[str, Any]] = []
    try:
        records = load_records(name, limit=SAMPLE_RECORDS)
        dataset.from_data_section(records, tokenizer, data, name)
        return []
    except (DataFileError, DataConfigError) as failure:
        problem = error(key, f"{key}: {failure}")
    if str(data.overlong) != "skip" or len(records) < SAMPLE_RECORDS:
        return [problem]
    try:  # every sampled record is too long (a file that does not read failed above): do they read when cut?
        dataset(records, tokenizer, max_length=data.max_length, overlong="truncate",
                apply_chat_template=data.apply_chat_template, source=name,
                **{column: data[column] for column in dataset.key_names})
    except (DataFileError, DataConfigError):
        return [problem]
    return [warning(key, (  # the run skips them and trains on the later records that fit, if any
        f"{key}: {name}: the first {SAMPLE_RECORDS} records are all longer than data.max_length={data.max_length} "
        "tokens, so the run skips them (data.overlong=skip)"
    ))]
