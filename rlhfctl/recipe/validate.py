"""validate_recipe: everything that can be checked without starting Ray or loading weights."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from rlhfctl.recipe.arithmetic import derive_batch_table
from rlhfctl.recipe.check_algorithm import check_algorithm
from rlhfctl.recipe.check_data import check_data
from rlhfctl.recipe.check_loggers import check_loggers
from rlhfctl.recipe.check_runtime import check_models, check_pools, check_resume
from rlhfctl.recipe.check_stage import check_stage
from rlhfctl.recipe.check_workers import check_reward_function, check_workers
from rlhfctl.recipe.field_checks import check_fields
from rlhfctl.recipe.report import ValidationReport, error
from rlhfctl.recipe.stages import is_stage

__all__ = ["validate_recipe"]


def validate_recipe(cfg: Any, batch_size: int | None = None) -> ValidationReport:
    """Check a loaded recipe (imports, files, pools, algorithm, batch arithmetic) and derive its batch table."""
    container = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    field_problems = check_fields(container)  # type: ignore[arg-type]
    report = ValidationReport(issues=[error(p.key_path, str(p)) for p in field_problems])
    if field_problems:
        return report  # later checks assume well-formed fields
    report.issues += check_loggers(cfg)
    if is_stage(cfg):  # sft, reward_model, dpo: their own checks, no rollout batch table
        report.pools, stage_issues = check_stage(cfg)
        report.issues += stage_issues
        return report
    pools, pool_issues = check_pools(cfg)
    report.pools = pools
    report.issues += pool_issues
    report.issues += check_workers(cfg)
    report.issues += check_reward_function(cfg)
    report.issues += check_algorithm(cfg)
    report.issues += check_data(cfg)
    report.issues += check_models(cfg)
    report.issues += check_resume(cfg)
    report.batch, batch_issues = derive_batch_table(cfg, pools, batch_size)
    report.issues += batch_issues
    return report
