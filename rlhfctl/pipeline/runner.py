"""Run a pipeline's stages in order on one Ray session, skipping stages already complete.

Each stage's recipe is loaded with the stage's overrides (``${stages.<name>.*}`` replaced by the
earlier stages' paths) plus ``trainer.output_dir=<output_dir>/<stage>`` and ``trainer.export_hf=true``.
All recipes are loaded and validated before anything runs (a problem in the last stage stops the run
before the first trains); missing outputs of earlier stages are expected at that point and each
stage is validated again just before it runs.

A stage is **skipped** when its ``COMPLETE`` marker matches its recipe and its model is there, and
every stage before it was skipped too; once one stage runs, the later ones run again as well (their
inputs changed). The marker is removed before a stage runs and written after it finished.
``<output_dir>/pipeline.json`` lists every stage's result.
"""

from __future__ import annotations

import json
import time
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


def _check(cfg: Any, stage: StageSpec, pending: list[Path], observer: PipelineObserver) -> None:
    """Validate a stage's recipe; errors about outputs of stages in ``pending`` (not run yet) are expected."""
    from rlhfctl.recipe.validate import validate_recipe  # pulls in torch: off the CLI's fast path

    report = validate_recipe(cfg)
    errors = [issue for issue in report.errors if not any(str(path) in issue.message for path in pending)]
    if errors:
        first = errors[0]
        raise _stage_error(stage, RecipeError(first.message, key_path=first.key_path))
    for issue in report.warnings:
        observer.message(f"stages.{stage.name}: {issue.message}", "warning")


def plan_stages(spec: PipelineSpec, observer: PipelineObserver | None = None) -> list[StagePlan]:
    """Load and validate every stage's recipe (outputs of earlier stages may not exist yet)."""
    observer = observer or PipelineObserver()
    plans = []
    for index, stage in enumerate(spec.stages):
        cfg = _load_stage(spec, stage)
        _check(cfg, stage, [spec.stage_dir(name) for name in spec.names()[:index]], observer)
        algorithm = str(resolve(cfg).algorithm.name)  # resolved once validate has passed it
        plans.append(StagePlan(index, stage.name, algorithm, spec.stage_dir(stage.name), cfg, fingerprint(cfg),
                               stage.describe_recipe()))
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

    _check(plan.cfg, stage, [], PipelineObserver())  # now with the earlier stages' models; warnings were shown when planning
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
