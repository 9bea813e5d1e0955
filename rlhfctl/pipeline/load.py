"""Read a pipeline file: ``output_dir`` and ``stages`` (each a recipe plus overrides), with command-line overrides.

::

    output_dir: runs/rlhf
    stages:
      - name: sft
        recipe: sft-quickstart.yaml            # a file (relative to this file, then the working
                                               # directory), a bundled recipe name, or an inline mapping
        overrides: [trainer.total_steps=60]    # a list of key=value / ~key, or a mapping of key: value
      - name: ppo
        recipe: quickstart.yaml
        overrides:
          roles.actor.model.path: ${stages.sft.output}

Command-line overrides: ``output_dir=DIR``, and ``<stage>.<recipe key>=value`` / ``~<stage>.<recipe key>``
added after that stage's own overrides. Every problem is a :class:`PipelineError` naming the key.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rlhfctl.pipeline.errors import PipelineError
from rlhfctl.pipeline.references import check_references
from rlhfctl.pipeline.spec import PipelineSpec, StageSpec
from rlhfctl.recipe.bundled import bundled_path, list_bundled, recipe_stem
from rlhfctl.recipe.errors import did_you_mean

__all__ = ["DEFAULT_OUTPUT_DIR", "load_pipeline", "pipeline_from_dict"]

DEFAULT_OUTPUT_DIR = "runs/pipeline"
_TOP_KEYS = ("output_dir", "stages")
_STAGE_KEYS = ("name", "recipe", "overrides")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def is_pipeline_file(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a YAML mapping with a top-level ``stages`` list (a pipeline, not a recipe)."""
    try:
        data = yaml.safe_load(Path(os.path.expanduser(str(path))).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # the recipe loader reports what is wrong with the file
    return isinstance(data, dict) and isinstance(data.get("stages"), list)


def load_pipeline(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> PipelineSpec:
    """Read a pipeline file and apply command-line overrides; raise PipelineError on any problem."""
    file = Path(os.path.expanduser(str(path)))
    if not file.is_file():
        raise PipelineError(f"pipeline file not found: {file} (working directory {os.getcwd()})", kind="file_not_found")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(file)
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise PipelineError(f"{where}: YAML syntax error: {problem}", kind="yaml_syntax") from None
    except UnicodeDecodeError as error:
        raise PipelineError(f"{file}: not valid UTF-8 ({error.reason})", kind="yaml_syntax") from None
    return pipeline_from_dict(data, overrides, base_dir=file.parent, source=str(file))


def pipeline_from_dict(
    data: Any, overrides: Sequence[str] = (), base_dir: str | os.PathLike[str] | None = None, source: str = "<pipeline>"
) -> PipelineSpec:
    """Check plain pipeline data, apply ``overrides``, resolve recipe files against ``base_dir``."""
    if not isinstance(data, Mapping):
        raise PipelineError(
            f"{source}: a pipeline file is a mapping with output_dir and stages, got {type(data).__name__}", kind="wrong_type"
        )
    for key in data:
        if key not in _TOP_KEYS:
            raise PipelineError(
                f"{source}: unknown key {key!r}{did_you_mean(str(key), _TOP_KEYS)} (a pipeline has: {', '.join(_TOP_KEYS)})",
                key_path=str(key), kind="unknown_key",
            )
    raw_stages = data.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise PipelineError(f"{source}: stages must be a non-empty list of {{name, recipe, overrides}}", key_path="stages", kind="missing")
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    stages = [_stage(item, index, base) for index, item in enumerate(raw_stages)]
    _unique(stages)
    output_dir = data.get("output_dir", DEFAULT_OUTPUT_DIR)
    if not isinstance(output_dir, str) or not output_dir.strip():
        raise PipelineError(f"output_dir: expected a directory path, got {output_dir!r}", key_path="output_dir", kind="wrong_type")
    output_dir = _apply_overrides(stages, list(overrides), output_dir)
    names = [stage.name for stage in stages]
    for index, stage in enumerate(stages):
        earlier, later = names[:index], names[index + 1 :]
        check_references(stage.overrides, f"stages.{stage.name}.overrides", stage.name, earlier, later)
        if isinstance(stage.recipe, dict):
            check_references(stage.recipe, f"stages.{stage.name}.recipe", stage.name, earlier, later)
    return PipelineSpec(Path(os.path.expanduser(output_dir)), stages, source)


def _stage(item: Any, index: int, base: Path) -> StageSpec:
    where = f"stages[{index}]"
    if not isinstance(item, Mapping):
        raise PipelineError(
            f"{where}: a stage is a mapping with name, recipe and overrides, got {type(item).__name__}",
            key_path=where, kind="wrong_type",
        )
    for key in item:
        if key not in _STAGE_KEYS:
            raise PipelineError(
                f"{where}: unknown key {key!r}{did_you_mean(str(key), _STAGE_KEYS)} (a stage has: {', '.join(_STAGE_KEYS)})",
                key_path=f"{where}.{key}", kind="unknown_key",
            )
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise PipelineError(
            f"{where}.name: a stage needs a name of letters, digits, '_' or '-' starting with a letter, got {name!r}",
            key_path=f"{where}.name", kind="missing",
        )
    where = f"stages.{name}"
    recipe = item.get("recipe")
    if isinstance(recipe, Mapping):
        recipe_value: str | dict[str, Any] = dict(recipe)
        recipe_path = None
    elif isinstance(recipe, str) and recipe.strip():
        recipe_value, recipe_path = recipe, _find_recipe(recipe, base, f"{where}.recipe")
    else:
        raise PipelineError(
            f"{where}.recipe: give a recipe file, a bundled recipe name or an inline recipe mapping, got {recipe!r}",
            key_path=f"{where}.recipe", kind="missing",
        )
    return StageSpec(name, recipe_value, _overrides(item.get("overrides"), f"{where}.overrides"), recipe_path)


def _find_recipe(value: str, base: Path, key: str) -> Path:
    candidate = Path(os.path.expanduser(value))
    for path in ([candidate] if candidate.is_absolute() else [base / candidate, candidate]):
        if path.is_file():
            return path
    found = bundled_path(value)
    if found is not None:
        return found
    bundled = [recipe.name for recipe in list_bundled()]
    hint = did_you_mean(recipe_stem(value), bundled)
    raise PipelineError(
        f"{key}: recipe file not found: {value} (looked in {base} and {os.getcwd()}){hint} "
        f"(bundled recipes: {', '.join(sorted(bundled)) or 'none'})",
        key_path=key, kind="file_not_found",
    )


def _overrides(value: Any, key: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [f"{name}={json.dumps(item)}" for name, item in value.items()]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise PipelineError(
        f"{key}: overrides are a list of 'key=value' / '~key' strings or a mapping of key: value, got {value!r}",
        key_path=key, kind="wrong_type",
    )


def _unique(stages: list[StageSpec]) -> None:
    seen: set[str] = set()
    for stage in stages:
        if stage.name in seen:
            raise PipelineError(
                f"stages.{stage.name}: two stages are named {stage.name!r}; names must be unique", key_path=f"stages.{stage.name}"
            )
        seen.add(stage.name)


def _apply_overrides(stages: list[StageSpec], overrides: list[str], output_dir: str) -> str:
    """Apply ``output_dir=...`` and ``[~]<stage>.<key>[=value]``; returns the output directory."""
    by_name = {stage.name: stage for stage in stages}
    for text in overrides:
        raw = text.strip()
        delete = raw.startswith("~")
        key, sep, value = raw.removeprefix("~").partition("=")
        if key == "output_dir" and sep and not delete:
            output_dir = value.strip()
            if not output_dir:
                raise PipelineError(f"override {text!r}: output_dir needs a directory", key_path="output_dir", kind="override_syntax")
            continue
        stage_name, dot, rest = key.partition(".")
        if stage_name not in by_name or not dot or not rest or sep == delete:
            raise PipelineError(
                f"override {text!r}: expected output_dir=DIR or <stage>.<recipe key>=value (or ~<stage>.<recipe key>), "
                f"with a stage of: {', '.join(by_name)}{did_you_mean(stage_name, by_name)}",
                key_path=key or None, kind="override_syntax",
            )
        by_name[stage_name].overrides.append(f"~{rest}" if delete else f"{rest}={value}")
    return output_dir
