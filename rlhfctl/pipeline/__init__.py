"""Pipelines: RLHF stages (sft, reward_model, ppo, dpo) run in order, each feeding the next.

Public API::

    from rlhfctl.pipeline import load_pipeline, run_pipeline, PipelineError
    spec = load_pipeline("recipes/pipeline-quickstart.yaml", ["output_dir=runs/rlhf"])
    results = run_pipeline(spec)          # StageResult per stage: status done/skipped, headline, model_dir

See ``docs/pipeline.md``.
"""

from rlhfctl.pipeline.errors import PipelineError
from rlhfctl.pipeline.load import load_pipeline, pipeline_from_dict
from rlhfctl.pipeline.observer import PipelineObserver, StagePlan, StageResult
from rlhfctl.pipeline.runner import plan_stages, run_pipeline
from rlhfctl.pipeline.spec import COMPLETE_MARKER, PipelineSpec, StageSpec

__all__ = [
    "COMPLETE_MARKER",
    "PipelineError",
    "PipelineObserver",
    "PipelineSpec",
    "StagePlan",
    "StageResult",
    "StageSpec",
    "load_pipeline",
    "pipeline_from_dict",
    "plan_stages",
    "run_pipeline",
]
