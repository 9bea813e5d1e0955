"""validate_recipe: everything that can be checked without starting Ray or loading weights (preflight included), as a ValidationReport."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from rlhfctl.recipe.arithmetic import BatchTable, derive_batch_table
from rlhfctl.recipe.check_agents import check_agents
from rlhfctl.recipe.check_agent_server import check_agent_server
from rlhfctl.recipe.check_algorithm import check_algorithm, check_stage, stage_recipe
from rlhfctl.recipe.check_distillation import check_distillation
from rlhfctl.recipe.check_environments import check_environments
from rlhfctl.recipe.check_importance import check_importance_correction
from rlhfctl.recipe.check_judge import check_judge, judge_notes
from rlhfctl.recipe.check_placement import check_placement, check_staleness_correction
from rlhfctl.recipe.check_partial import check_partial
from rlhfctl.recipe.check_rollout_precision import check_rollout_precision
from rlhfctl.recipe.check_remote_reward import check_remote_reward
from rlhfctl.recipe.check_restarts import check_restarts
from rlhfctl.recipe.check_sandbox import check_sandbox
from rlhfctl.recipe.check_stage_data import check_stage_data
from rlhfctl.recipe.check_tasks import check_tasks
from rlhfctl.recipe.check_tensor_parallel import check_tensor_parallel
from rlhfctl.recipe.check_runtime import (
    check_data,
    check_loggers,
    check_models,
    check_pools,
    check_resume,
    check_rollout_engine,
    check_strategies,
    check_token_budgets,
    check_workers,
)
from rlhfctl.recipe.errors import Issue, RecipeError, error, warning
from rlhfctl.recipe.example_prompt import ExamplePrompt, example_prompt
from rlhfctl.recipe.field_checks import check_fields
from rlhfctl.recipe.memory_plan import MemoryPlan, plan_memory
from rlhfctl.recipe.pools import PoolInfo
from rlhfctl.recipe.preflight import preflight
from rlhfctl.recipe.resolved import resolve
from rlhfctl.recipe.check_reward_names import reward_notes
from rlhfctl.recipe.specs import Recipe
from rlhfctl.recipe.stages import stage_roles
from rlhfctl.recipe.task_listing import TaskListing, task_listing

if TYPE_CHECKING:
    from rlhfctl.data.summary import DataFileSummary

__all__ = ["PPO_CHECKS", "RUN_CHECKS", "STAGE_CHECKS", "Check", "ValidationReport", "memory_issues", "validate_recipe"]


@dataclass
class ValidationReport:
    """Everything ``validate_recipe`` found, and what it derived (batch arithmetic, pools, memory plan)."""

    issues: list[Issue] = field(default_factory=list)
    batch: BatchTable | None = None
    pools: dict[str, PoolInfo] = field(default_factory=dict)
    memory: MemoryPlan | None = None
    example: ExamplePrompt | None = None
    """The first training prompt as the actor's tokenizer renders and encodes it (when both are on disk)."""
    data: list[DataFileSummary] = field(default_factory=list)
    """What preflight read of each data file (rows, columns, prompt form, ground truth), in recipe order."""
    notes: list[str] = field(default_factory=list)
    """Facts worth a line that are neither errors nor warnings (the math reward's answer checker)."""
    recipe: Recipe | None = None
    """The resolved recipe the checks read (None when the fields themselves were wrong): what a run then uses."""
    tasks: list[TaskListing] = field(default_factory=list)
    """The tasks the prompts are generated from (data.task or data.tasks): split sizes and an example prompt each."""

    @property
    def errors(self) -> list[Issue]:
        """Issues that stop a run."""
        return [issue for issue in self.issues if issue.severity == "error"]

    @property
    def warnings(self) -> list[Issue]:
        """Issues worth a look."""
        return [issue for issue in self.issues if issue.severity == "warning"]

    @property
    def ok(self) -> bool:
        """True without errors (warnings allowed)."""
        return not self.errors

    def raise_for_errors(self) -> None:
        """Raise the first error as a RecipeError (``.key_path`` set); do nothing when ok."""
        if self.errors:
            first = self.errors[0]
            more = len(self.errors) - 1
            suffix = f" (and {more} more error{'s' if more > 1 else ''}; run rlhfctl validate)" if more else ""
            raise RecipeError(first.message + suffix, key_path=first.key_path)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view: ok, errors, warnings, batch, pools, memory, example, data, notes, tasks."""
        return {
            "ok": self.ok,
            "errors": [asdict(issue) for issue in self.errors],
            "warnings": [asdict(issue) for issue in self.warnings],
            "batch": None if self.batch is None else self.batch.to_dict(),
            "pools": {name: pool.to_dict() for name, pool in self.pools.items()},
            "memory": None if self.memory is None else self.memory.to_dict(),
            "example": None if self.example is None else self.example.to_dict(),
            "data": [summary.to_dict() for summary in self.data],
            "notes": list(self.notes),
            "tasks": [task.to_dict() for task in self.tasks],
        }


def memory_issues(plan: MemoryPlan) -> list[Issue]:
    """A warning for each role the plan skipped (its reason) and each call above 90% of the device; an error (exit 2)
    for each call above the device and each vLLM engine whose weights and one sequence's KV exceed its share; each
    names the largest terms and the knobs that help, with values."""
    skipped = [warning(f"roles.{role}.model", f"memory plan: roles.{role} skipped ({reason}); its memory is not "
                       "counted in its pool's calls") for role, reason in plan.skipped.items()]
    tight = [warning(misfit.key_path, misfit.message) for misfit in plan.tight()]
    return skipped + tight + [error(misfit.key_path, misfit.message) for misfit in plan.misfits()]


Check = Callable[[Recipe], list[Issue]]
"""A check: what is wrong with a resolved recipe, each issue naming its key path (it derives no fact of its own)."""

#: The checks of every recipe, before its algorithm's own.
RUN_CHECKS: tuple[Check, ...] = (check_loggers, check_restarts, check_tasks)

#: The checks of a PPO-family recipe, in the order validate runs and reports them, grouped by concern.
PPO_CHECKS: tuple[Check, ...] = (
    check_pools, check_workers,                                           # where the roles run, and with what
    check_algorithm, check_data, check_models, check_distillation,        # the step, its data and models
    check_rollout_engine, check_importance_correction, check_tensor_parallel, check_environments, check_agents, check_agent_server, check_sandbox,  # the rollout
    check_placement, check_partial, check_staleness_correction, check_rollout_precision,  # placement, staleness, precision
    check_judge,                                                          # the reward's LLM judge
    check_remote_reward,                                                  # the reward service over HTTP
    check_resume, check_strategies,                                       # resumption, sharding
)

#: The checks of a supervised stage (sft, reward_model, dpo): no rollout, no batch table.
STAGE_CHECKS: tuple[Check, ...] = (check_stage, check_placement, check_token_budgets, check_stage_data)


def validate_recipe(cfg: Any, batch_size: int | None = None, device_memory: int | None = None) -> ValidationReport:
    """Check a loaded recipe (imports, files, pools, algorithm, batch arithmetic) and derive its batch table
    and memory plan (compared with ``device_memory`` bytes when given)."""
    container = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    field_problems = check_fields(container)  # type: ignore[arg-type]
    report = ValidationReport(issues=[error(p.key_path, str(p)) for p in field_problems])
    if field_problems:
        return report  # later checks assume well-formed fields
    recipe = report.recipe = resolve(cfg)  # once: every check below reads it, and so does the run that follows
    report.issues += _run(RUN_CHECKS, recipe)
    report.tasks = task_listing(recipe)
    if recipe.stage is not None:
        return _validate_stage(recipe, report, device_memory)
    report.pools = dict(recipe.pools)
    report.issues += _run(PPO_CHECKS, recipe)
    report.batch, batch_issues = derive_batch_table(recipe, batch_size)
    report.issues += batch_issues + check_token_budgets(recipe)
    report.memory = plan_memory(recipe, report.pools, device_memory)
    report.issues += memory_issues(report.memory)
    preflight_issues, report.data = preflight(recipe, report.pools, list(recipe.roles))  # data, reward signature, models, machine
    report.issues += preflight_issues
    report.notes += reward_notes(recipe)
    report.example, example_issues = example_prompt(recipe)
    report.issues += example_issues
    report.notes += judge_notes(recipe, None if report.example is None else report.example.text,
                                [task.example for task in report.tasks])
    return report


def _validate_stage(recipe: Recipe, report: ValidationReport, device_memory: int | None) -> ValidationReport:
    """sft, reward_model, dpo: their own checks on the roles they start, then the memory plan and preflight."""
    report.issues += _run(STAGE_CHECKS, recipe)
    started = stage_recipe(recipe)
    report.pools = {} if started is None else dict(started.pools)
    report.memory = plan_memory(recipe, report.pools, device_memory)
    report.issues += memory_issues(report.memory)
    if report.ok and started is not None:
        report.issues += preflight(recipe, report.pools, list(stage_roles(recipe.sections)))[0]
    return report


def _run(checks: tuple[Check, ...], recipe: Recipe) -> list[Issue]:
    return [issue for check in checks for issue in check(recipe)]
