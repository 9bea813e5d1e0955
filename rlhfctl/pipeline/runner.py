"""Run a pipeline's stages in order on one Ray session, skipping stages already complete.

Each stage's recipe is loaded with the stage's overrides (``${stages.<name>.*}`` replaced by the
earlier stages' paths) plus ``trainer.output_dir=<output_dir>/<stage>`` and ``trainer.export_hf=true``.
All recipes are loaded and validated before anything runs, with the checks ``rlhfctl validate`` makes
(data files read and tokenized, models, prompt lengths): a problem in the last stage stops the run before
the first trains, and one error lists every problem of every stage. Missing outputs of earlier stages
are expected at that point (a stage that trains on an earlier stage's model has its data tokenized with
the tokenizer that model will hold), and each stage is validated again just before it runs.

A stage is **skipped** when its ``COMPLETE`` marker matches its recipe and its model is there, and
every stage before it was skipped too; once one stage runs, the later ones run again as well (their
inputs changed). The marker is removed before a stage runs and written after it finished.
``<output_dir>/pipeline.json`` lists every stage's result.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhfctl.pipeline.errors import PipelineError
from rlhfctl.pipeline.headline import headline
from rlhfctl.pipeline.markers import clear_marker, fingerprint, is_complete, read_marker, write_marker
from rlhfctl.pipeline.observer import PipelineObserver, StagePlan, StageResult
from rlhfctl.pipeline.references import substitute
from rlhfctl.pipeline.spec import MODEL_DIR, PipelineSpec, StageSpec
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.load import load_recipe, recipe_from_dict
from rlhfctl.recipe.resolved import resolve

__all__ = ["SUMMARY_FILE", "plan_stages", "run_pipeline"]

SUMMARY_FILE = "pipeline.json"


def _stage_error(stage: StageSpec, error: RecipeError) -> PipelineError:
    key = f"stages.{stage.name}" + (f".{error.key_path}" if error.key_path else "")
    return PipelineError(f"stages.{stage.name} ({stage.describe_recipe()}): {error}", key_path=key, kind=error.kind)


def _load_stage(spec: PipelineSpec, stage: StageSpec) -> Any:
    """The stage's recipe, loaded with its overrides (not validated yet)."""
    outputs = {name: spec.attributes(name) for name in spec.names()}
    directory = spec.stage_dir(stage.name)
    # A stage that runs again (its inputs changed) replaces its previous run in its directory.
    overrides = [*substitute(stage.overrides, outputs), f"trainer.output_dir={directory}", "trainer.export_hf=true",
                 "trainer.overwrite=true"]
    try:
        if stage.recipe_path is not None:
            cfg = load_recipe(stage.recipe_path, overrides)
        else:
            cfg = recipe_from_dict(substitute(stage.recipe, outputs), overrides)
    except RecipeError as error:
        raise _stage_error(stage, error) from None
    return cfg


def _mentions(message: str, path: str) -> bool:
    """``path`` appears in ``message`` as a whole path (``runs/sft`` is not in ``runs/sft2``)."""
    return re.search(re.escape(path) + r"(?![\w.-])", message) is not None


def _path(text: str) -> str:
    return os.path.normpath(os.path.expanduser(text))


@dataclass
class _Pending:
    """The earlier stages, not run yet when the pipeline is planned: their directories (errors about what is in
    them are expected) and, per model directory, the model section it will hold (its tokenizer exported with it)."""

    directories: list[str] = field(default_factory=list)
    models: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def add(self, directory: Path, model: dict[str, Any] | None) -> None:
        """An earlier stage's directory and the model section it trains (itself a pending model: what that holds)."""
        self.directories.append(str(directory))
        self.models[_path(str(directory / MODEL_DIR))] = self.stand_in(model) if model is not None else None

    def stand_in(self, model: dict[str, Any]) -> dict[str, Any] | None:
        """The model section to take ``model``'s tokenizer from: itself, or what the pending model directory it
        names will hold (with ``model``'s own chat_template, when set); None when that is unknown."""
        source = model.get("tokenizer_path") or model.get("path")
        if not source or _path(str(source)) not in self.models:
            return model
        earlier = self.models[_path(str(source))]
        if earlier is None:
            return None
        return {**earlier, **({"chat_template": model["chat_template"]} if model.get("chat_template") else {})}


def _check(cfg: Any, stage: StageSpec, pending: _Pending, observer: PipelineObserver) -> tuple[Any, list[PipelineError]]:
    """Validate a stage's recipe as ``rlhfctl validate`` does: (the resolved recipe or None, every error, each
    naming the stage). A stage that trains on an earlier stage's model, not there yet, has its data read with the
    tokenizer that model will hold."""
    # pulls in torch: off the CLI's fast path
    from rlhfctl.recipe.check_stage_data import check_stage_data, trained_model
    from rlhfctl.recipe.validate import validate_recipe

    report = validate_recipe(cfg)
    issues = list(report.issues)
    recipe = report.recipe
    model = trained_model(recipe) if recipe is not None and recipe.stage is not None else None
    stand_in = pending.stand_in(model) if model is not None else None
    if stand_in is not None and stand_in is not model:
        issues += check_stage_data(recipe, stand_in)  # validate read no records when the model is not there yet
    issues = list({issue.message: issue for issue in issues  # a stage complete from an earlier run: found twice
                   if not any(_mentions(issue.message, path) for path in pending.directories)}.values())
    for issue in issues:
        if issue.severity == "warning":
            observer.message(f"stages.{stage.name}: {issue.message}", "warning")
    return recipe, [_stage_error(stage, RecipeError(issue.message, key_path=issue.key_path))
                    for issue in issues if issue.severity == "error"]


def _combined(problems: list[tuple[str, PipelineError]]) -> PipelineError:
    """One error for every (stage, problem) found, with the first's key path; a single problem as it is."""
    if len(problems) == 1:
        return problems[0][1]
    stages = ", ".join(dict.fromkeys(stage for stage, _ in problems))
    lines = "\n".join(f"  [{number}] {problem}" for number, (_, problem) in enumerate(problems, start=1))
    first = problems[0][1]
    return PipelineError(f"{len(problems)} problems in stages {stages}; nothing has run:\n{lines}",
                         key_path=first.key_path, kind=first.kind)


def plan_stages(spec: PipelineSpec, observer: PipelineObserver | None = None) -> list[StagePlan]:
    """Load and validate every stage's recipe before any stage runs (outputs of earlier stages may not exist yet);
    one PipelineError lists every problem of every stage."""
    from rlhfctl.recipe.check_stage_data import trained_model  # pulls in torch: off the CLI's fast path

    observer = observer or PipelineObserver()
    plans: list[StagePlan] = []
    problems: list[tuple[str, PipelineError]] = []
    pending = _Pending()
    for index, stage in enumerate(spec.stages):
        try:
            cfg = _load_stage(spec, stage)
        except PipelineError as error:
            problems.append((stage.name, error))
            pending.add(spec.stage_dir(stage.name), None)
            continue
        recipe, errors = _check(cfg, stage, pending, observer)
        problems += [(stage.name, error) for error in errors]
        pending.add(spec.stage_dir(stage.name), trained_model(recipe) if recipe is not None else None)
        if not errors and recipe is not None:
            plans.append(StagePlan(index, stage.name, str(recipe.algorithm.name), spec.stage_dir(stage.name), cfg,
                                   fingerprint(cfg), stage.describe_recipe()))
    if problems:
        raise _combined(problems)
    return plans


def _start_ray(plans: list[StagePlan]) -> Any:
    """One Ray session for the stages to run (the first Ray stage's settings); None when all run locally."""
    settings = (resolve(plan.cfg).ray for plan in plans)  # each stage's recipe, validated when planned
    ray_cfg = next((ray for ray in settings if ray.backend == "ray"), None)
    if ray_cfg is None:
        return None
    # Ray's helpers: only when a pipeline starts Ray, off rlhfctl --help's path
    from rlhfctl.ray_cluster import start_or_join_ray

    return start_or_join_ray(address=ray_cfg.address, num_cpus=ray_cfg.num_cpus, num_gpus=ray_cfg.num_gpus,
                             dashboard=bool(ray_cfg.dashboard))


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in summary.items() if isinstance(value, (int, float, str, bool)) or value is None}


def _run_stage(plan: StagePlan, stage: StageSpec, observer: PipelineObserver) -> StageResult:
    from rlhfctl.trainer.run import run_training  # the trainer (torch, ray): only when a stage runs

    errors = _check(plan.cfg, stage, _Pending(), PipelineObserver())[1]  # now with the earlier stages' models;
    if errors:  # warnings were shown when planning
        raise _combined([(stage.name, error) for error in errors])
    clear_marker(plan.directory)
    observer.stage_started(plan)
    start = time.perf_counter()
    try:
        summary = _flat(run_training(plan.cfg, observer.stage_reporter(plan)))
    except BaseException as error:
        observer.stage_failed(plan, error)
        raise
    seconds = time.perf_counter() - start
    result = StageResult(plan.name, plan.algorithm, "done", seconds, headline(plan.algorithm, summary),
                         str(plan.directory / MODEL_DIR), summary)
    write_marker(plan.directory, {"stage": plan.name, "algorithm": plan.algorithm, "fingerprint": plan.fingerprint,
                                  "seconds": seconds, "summary": summary})
    observer.stage_finished(plan, result)
    return result


def _skipped(plan: StagePlan, observer: PipelineObserver) -> StageResult:
    marker = read_marker(plan.directory) or {}
    summary = marker.get("summary", {})
    result = StageResult(plan.name, plan.algorithm, "skipped", 0.0, headline(plan.algorithm, summary),
                         str(plan.directory / MODEL_DIR), summary)
    observer.stage_skipped(plan, result)
    return result


def run_pipeline(spec: PipelineSpec, observer: PipelineObserver | None = None) -> list[StageResult]:
    """Run (or skip) every stage in order; returns their results and writes ``<output_dir>/pipeline.json``."""
    observer = observer or PipelineObserver()
    start = time.perf_counter()
    plans = plan_stages(spec, observer)
    observer.pipeline_started(plans, spec.output_dir)
    session = None
    results: list[StageResult] = []
    try:
        rerun = False
        for position, (plan, stage) in enumerate(zip(plans, spec.stages)):
            if not rerun and is_complete(plan.directory, plan.fingerprint):
                results.append(_skipped(plan, observer))
                continue
            if not rerun:
                session = _start_ray(plans[position:])  # started once, only when a stage has to run
            rerun = True
            results.append(_run_stage(plan, stage, observer))
    finally:
        if session is not None:
            session.shutdown()
    seconds = time.perf_counter() - start
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    (spec.output_dir / SUMMARY_FILE).write_text(json.dumps(
        {"seconds": seconds, "stages": [result.__dict__ for result in results]}, indent=1, default=str))
    observer.pipeline_finished(results, seconds)
    return results
