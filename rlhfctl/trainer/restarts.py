"""Runs that heal themselves (``trainer.max_restarts``): a lost worker costs the steps since the last checkpoint.

When a worker is lost (its process died, or a call ran past ``trainer.call_timeout_s``) and restarts are
left, the run stops every group, waits up to ``trainer.restart_wait_s`` for the pools' resources to be
free in Ray again, and starts a fresh trainer that resumes from the latest complete checkpoint, the way
``trainer.resume=auto`` does: the steps after it are redone and logged once. :class:`RestartPolicy`
holds the failures seen; out of restarts, or when the resources never come back, the run exits 3 with
:class:`RestartsExhausted`, which lists them all. A worker lost to a stop signal is never restarted
(``run.py`` asks :func:`rlhfctl.run_signals.stop_cause` first).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from rlhfctl.errors import WorkerLost
from rlhfctl.recipe.specs import Recipe
from rlhfctl.trainer import checkpoint

__all__ = ["RESTARTS_METRIC", "Failure", "RestartPolicy", "RestartsExhausted", "pool_needs", "wait_for_resources"]

#: The number of restarts so far, in the metrics of every step logged after the first restart.
RESTARTS_METRIC = "run/restarts"
POLL_S = 0.5


@dataclass(frozen=True)
class Failure:
    """One lost worker: the last step the run had completed, and who was lost where and why."""

    step: int
    role: str
    rank: Any
    method: str
    cause: str

    @classmethod
    def of(cls, error: WorkerLost, step: int) -> "Failure":
        """What a WorkerDiedError or WorkerTimeoutError says (its class name stands in for a missing cause)."""
        return cls(step, str(getattr(error, "role", "?")), getattr(error, "rank", "?"),
                   str(getattr(error, "method", "?")), str(getattr(error, "cause", None) or type(error).__name__))

    def __str__(self) -> str:
        return f"after step {self.step}: {self.role} rank {self.rank} lost during {self.role}.{self.method} ({self.cause})"


class RestartsExhausted(WorkerLost):
    """Workers were lost more often than ``trainer.max_restarts`` allows, or their resources never came back (exit 3)."""

    def __init__(self, failures: list[Failure], reason: str) -> None:
        self.failures = list(failures)
        listed = "; ".join(f"[{index}] {failure}" for index, failure in enumerate(self.failures, 1))
        super().__init__(f"{reason}; {len(self.failures)} worker failure(s): {listed}")


@dataclass
class RestartPolicy:
    """How many restarts a run may make, how long each waits for resources, and the failures so far."""

    max_restarts: int = 0
    wait_s: float = 120.0
    failures: list[Failure] = field(default_factory=list)
    needs: dict[str, float] = field(default_factory=dict)
    """The CPUs and GPUs the run's pools reserve (:func:`pool_needs`), set when the groups are built."""

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> "RestartPolicy":
        """``trainer.max_restarts`` and ``trainer.restart_wait_s`` of the resolved recipe."""
        return cls(int(recipe.trainer.max_restarts), float(recipe.trainer.restart_wait_s))

    @property
    def restarts(self) -> int:
        """Restarts made so far (every failure but one past the limit was restarted)."""
        return min(len(self.failures), self.max_restarts)

    def record(self, error: WorkerLost, step: int) -> Failure:
        """Note a lost worker; raises (the error itself with no restarts configured, else RestartsExhausted) when
        no restart is left."""
        failure = Failure.of(error, step)
        self.failures.append(failure)
        if self.max_restarts == 0:
            raise error  # today's behaviour: the lost worker's own message, exit 3
        if len(self.failures) > self.max_restarts:
            raise RestartsExhausted(self.failures, f"trainer.max_restarts={self.max_restarts} used up") from error
        return failure

    def wait_for_resources(self, needs: dict[str, float], error: BaseException) -> None:
        """Wait until Ray has ``needs`` free again; RestartsExhausted when it does not within ``wait_s``."""
        if not wait_for_resources(needs, self.wait_s):
            raise RestartsExhausted(self.failures, f"the pools' resources {_shown(needs)} were not free again within "
                                    f"trainer.restart_wait_s={self.wait_s:g} s") from error


def pool_needs(pools: list[Any]) -> dict[str, float]:
    """The CPUs and GPUs the run's Ray pools reserve (a bundle per process)."""
    needs: dict[str, float] = {}
    for pool in pools:
        bundle = getattr(pool, "bundle", None)
        if bundle is None:
            continue
        for resource, amount in bundle().items():
            needs[resource] = needs.get(resource, 0.0) + amount * pool.world_size
    return needs


def _ray_available() -> dict[str, float] | None:
    """Ray's free resources, or None without a Ray connection (the local backend needs none)."""
    import ray  # ray: only under the ray backend, off the CLI's fast path

    return ray.available_resources() if ray.is_initialized() else None


def wait_for_resources(needs: dict[str, float], wait_s: float,
                       available: Callable[[], dict[str, float] | None] | None = None) -> bool:
    """Whether Ray's free resources cover ``needs`` within ``wait_s`` seconds (polled; the dead actors' and the
    released placement groups' CPUs and GPUs come back as Ray notices them)."""
    available = available or _ray_available
    deadline = time.monotonic() + wait_s
    while True:
        try:
            free = available()
        except Exception:  # noqa: BLE001 - Ray itself may be going; keep asking until the deadline
            free = {}
        if free is None or all(free.get(key, 0.0) + 1e-9 >= amount for key, amount in needs.items()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def _shown(needs: dict[str, float]) -> str:
    return "{" + ", ".join(f"{key}: {amount:g}" for key, amount in sorted(needs.items())) + "}"


def restart_recipe(cfg: DictConfig, output_dir: Path, started_at_step: int) -> tuple[DictConfig, Path | None]:
    """The recipe of the next attempt: resume from the latest complete checkpoint in ``output_dir`` when this run
    reached it (at or after ``started_at_step``), else as the run first started (its own resume point, or step 0).

    A restart from step 0 resumes ``auto`` over an output_dir with no checkpoint, so the logs are cut back to
    nothing rather than appended to."""
    latest = checkpoint.read_latest(output_dir)
    restarted = copy.deepcopy(cfg)
    if latest is not None and checkpoint.checkpoint_step(latest) >= started_at_step:
        restarted.trainer.resume = str(latest)
        return restarted, latest
    if str(cfg.trainer.resume) == "never":
        restarted.trainer.resume = "auto"
    return restarted, checkpoint.resume_point(str(restarted.trainer.resume), output_dir)


class CountedLoggers:
    """A run's loggers, with ``run/restarts`` added to every step's metrics (so TensorBoard and W&B plot it)."""

    def __init__(self, loggers: Any, restarts: int) -> None:
        self._loggers, self.restarts = loggers, restarts

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self._loggers.write(step, {**metrics, RESTARTS_METRIC: float(self.restarts)})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loggers, name)
