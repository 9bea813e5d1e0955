"""Run a training job: pick the trainer (``algorithm.name``), start or join Ray, fit, and always clean up."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rlhfctl.errors import WorkerLost
from rlhfctl.ray_cluster import start_or_join_ray
from rlhfctl.recipe.errors import RecipeError
from rlhfctl.recipe.resolved import resolve
from rlhfctl.recipe.specs import Recipe
from rlhfctl.run_signals import safe_point_pending, stop_cause, stop_on_signals
from rlhfctl.single_controller.rank_progress import watch_rank_progress
from rlhfctl.trace import TraceRecorder, brief_summary
from rlhfctl.trainer.output_dir import prepare_output_dir
from rlhfctl.trainer.reporting import Reporter
from rlhfctl.trainer.restarts import CountedLoggers, RestartPolicy, pool_needs, restart_recipe
from rlhfctl.trainer.trainer_base import TrainerBase

__all__ = ["ALGORITHMS", "make_trainer", "plot_command", "run_training"]

ALGORITHMS = ("ppo", "sft", "reward_model", "dpo")


def make_trainer(cfg: DictConfig, reporter: Reporter, recipe: Recipe | None = None) -> TrainerBase:
    """The trainer for ``algorithm.name``: PPOTrainer (ppo, the default), SFTTrainer, RewardModelTrainer or DPOTrainer,
    built from ``recipe`` (``cfg`` resolved, when not given)."""
    name = str((recipe.algorithm if recipe is not None else cfg.algorithm).name)
    if name == "ppo":
        from rlhfctl.trainer.ppo_trainer import PPOTrainer  # transformers: only the named trainer loads, off the CLI's fast path

        return PPOTrainer(cfg, reporter, recipe=recipe)
    if name == "sft":
        from rlhfctl.trainer.sft_trainer import SFTTrainer  # as above

        return SFTTrainer(cfg, reporter, recipe=recipe)
    if name == "reward_model":
        from rlhfctl.trainer.reward_model_trainer import RewardModelTrainer  # as above

        return RewardModelTrainer(cfg, reporter, recipe=recipe)
    if name == "dpo":
        from rlhfctl.trainer.dpo_trainer import DPOTrainer  # as above

        return DPOTrainer(cfg, reporter, recipe=recipe)
    raise RecipeError(f"algorithm.name: {name!r} is not one of: {', '.join(ALGORITHMS)}", "algorithm.name", "bad_choice")


class _SilentReporter:
    """Used when the caller passes no reporter (library use, tests)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def run_training(cfg: DictConfig, reporter: Reporter | None = None, recipe: Recipe | None = None) -> dict[str, Any]:
    """Train as the recipe says (``algorithm.name`` picks the trainer); returns the run's summary."""
    reporter = reporter or _SilentReporter()
    recipe = recipe if recipe is not None else resolve(cfg)  # the run reads it (a restart resolves the one that resumes)
    prepare_output_dir(recipe)
    session = None
    if recipe.ray.backend == "ray":
        session = start_or_join_ray(
            address=recipe.ray.address,
            num_cpus=recipe.ray.num_cpus,
            num_gpus=recipe.ray.num_gpus,
            dashboard=bool(recipe.ray.dashboard),
        )
    with stop_on_signals():  # after ray.init, which installs Ray's own SIGTERM handler
        return _train(cfg, recipe, reporter, session)


def _train(cfg: DictConfig, recipe: Recipe, reporter: Any, session: Any) -> dict[str, Any]:
    """Build the trainer, fit, summarise; restart after a lost worker (``trainer.max_restarts``); save on an
    interrupt or stop signal; always stop what was started."""
    trainer = None
    observer = getattr(reporter, "rank_progress", None) if recipe.trainer.live_progress else None
    restarts = RestartPolicy.from_recipe(recipe)
    earlier: TraceRecorder | None = None  # the trace of the attempts before a restart: the summary counts the whole run
    try:
        with watch_rank_progress(recipe.ray.backend, observer):  # stops polling before Ray goes down
            while True:
                trainer = None
                try:
                    trainer = _start_trainer(cfg, recipe, reporter, restarts)
                    if earlier is not None:
                        trainer.trace.take_over(earlier, trainer.start_step)
                    _fit(trainer, reporter)
                    return _finish(trainer, reporter)
                except WorkerLost as error:
                    if stop_cause(error) is not error:
                        raise  # a stop signal reached the workers: stop_on_signals names it
                    earlier = trainer.trace if trainer is not None else earlier
                    cfg = _restart(cfg, recipe, trainer, restarts, error, reporter)
                    recipe = resolve(cfg)
    finally:
        with safe_point_pending():  # a stop signal that arrives now waits until everything is stopped
            if trainer is not None:
                trainer.shutdown()
            if session is not None:
                session.shutdown()


def _start_trainer(cfg: DictConfig, recipe: Recipe, reporter: Any, restarts: RestartPolicy) -> TrainerBase:
    """A trainer with its groups built, set up (resumed when the recipe says so); ``run/restarts`` logged after a restart."""
    trainer = make_trainer(cfg, reporter, recipe)
    restarts.needs = pool_needs(getattr(trainer.groups, "pools", []))  # what a restart waits for, even if setup fails
    try:
        for group in trainer.groups.all():
            group.observers.append(_DispatchForwarder(reporter))
        reporter.run_started({"output_dir": str(trainer.output_dir), "total_steps": recipe.trainer.total_steps,
                              "roles": {role: group.world_size for role, group in trainer.groups.groups.items()}})
        trainer.setup()
    except BaseException:
        trainer.shutdown()  # a failed setup leaves no worker behind
        raise
    if restarts.restarts:
        trainer.metrics_log = CountedLoggers(trainer.metrics_log, restarts.restarts)
    return trainer


def _fit(trainer: TrainerBase, reporter: Any) -> None:
    """Fit and wait for the last save; on Ctrl-C or a stop signal, save what can be saved and raise the stop."""
    try:
        trainer.fit()
        trainer.wait_for_checkpoint()  # the last save's background write
    except (KeyboardInterrupt, WorkerLost) as error:
        stop = stop_cause(error)  # a stop signal may surface as a bare KeyboardInterrupt or a lost worker
        if not isinstance(stop, KeyboardInterrupt):
            raise  # a worker lost on its own
        if isinstance(error, WorkerLost):  # the signal reached the workers too: nothing left to save
            reporter.message(f"{stop}: {error}; the previous checkpoint is kept")
        else:
            _save_on_interrupt(trainer, reporter, stop)
        if stop is error:
            raise
        raise stop from error


def _restart(cfg: DictConfig, recipe: Recipe, trainer: TrainerBase | None, restarts: RestartPolicy, error: WorkerLost,
             reporter: Any) -> DictConfig:
    """Record the lost worker (raises when no restart is left), stop every group, wait for the pools' resources and
    return the recipe of the next attempt, which resumes from the latest complete checkpoint."""
    step = trainer.completed_step if trainer is not None else 0
    started_at = getattr(trainer, "start_step", 0)
    failure = restarts.record(error, step)
    with safe_point_pending():  # a stop signal waits until the groups are down
        if trainer is not None:
            trainer.shutdown()
    restarts.wait_for_resources(restarts.needs, error)
    cfg, resume_from = restart_recipe(cfg, Path(recipe.trainer.output_dir), started_at)
    where = f"from {resume_from}" if resume_from is not None else "from step 0 (no checkpoint yet)"
    reporter.message(f"restart {len(restarts.failures)}/{restarts.max_restarts}: {failure}; starting fresh workers "
                     f"{where}", "warning")
    return cfg


def _finish(trainer: TrainerBase, reporter: Reporter) -> dict[str, Any]:
    """The run's summary (with the trace's, and the command that plots its metrics), reported and returned."""
    summary = trainer.summary()
    trace = trainer.trace_summary()
    summary.update(brief_summary(trace))
    trace_path = trainer.write_trace()
    if trace_path is not None:
        summary["trace_file"] = str(trace_path)
    summary["trace"] = trace
    if Path(trainer.metrics_log.path).is_file():  # trainer.loggers lists jsonl: there is something to plot
        summary["plot"] = plot_command(trainer.output_dir)
    reporter.run_finished(summary)
    return summary


def plot_command(output_dir: str | Path) -> str:
    """``rlhfctl plot DIR --output DIR/metrics.png``: the command that draws a run's metrics (the summary's last line)."""
    return f"rlhfctl plot {shlex.quote(str(output_dir))} --output {shlex.quote(str(Path(output_dir) / 'metrics.png'))}"


def _save_on_interrupt(trainer: TrainerBase, reporter: Reporter, stop: KeyboardInterrupt | None = None) -> None:
    """On Ctrl-C or a stop signal (``stop``), finish the checkpoint still being written, then checkpoint the last
    completed step (if asked and not saved yet) and wait for it; best effort. A stop forced inside a step (a
    second request) saves nothing: the workers may hold part of that step."""
    trainer.write_trace()
    step = trainer.completed_step
    reason = str(stop) if stop is not None else ""  # a bare KeyboardInterrupt (Ctrl-C) has no text
    try:
        trainer.wait_for_checkpoint()
        running = getattr(trainer, "running_step", None)
        if running is not None:  # a second request stopped the step midway: the workers hold part of it
            reporter.message(f"{reason or 'interrupted'} inside step {running}: its state is partial, so it is not "
                             f"saved; the checkpoint of step {trainer.saved_step} is kept")
            return
        if not trainer.recipe.trainer.save_on_interrupt or step == 0 or step == trainer.saved_step:
            return
        reporter.message(f"{reason or 'interrupted'}: saving step {step} before exiting")
        trainer.save(step)
        trainer.wait_for_checkpoint()
    except BaseException as error:  # noqa: BLE001 - workers may be gone already; keep the older checkpoint
        reporter.message(f"could not save on interrupt ({type(error).__name__}: {error}); the previous checkpoint is kept")


class _DispatchForwarder:
    """Passes group-call events to the reporter (the live per-dispatch view)."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter

    def call_started(self, event: Any) -> None:
        self.reporter.dispatch_started(event)

    def call_finished(self, event: Any) -> None:
        self.reporter.dispatch_finished(event)
