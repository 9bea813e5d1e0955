"""Start a private local Ray, or join an existing cluster, and always clean up what we started."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rlhfctl.library_output import quiet_environment

# Task arguments and results up to this size travel inside Ray's call messages instead of through the
# object store (Ray's default is 100 KiB). A training step's batch is typically a few hundred KB, and
# the object store's create/seal round trips cost more than copying that: a 150 KB argument took
# 6.9 ms per actor call through the store and 2.5 ms inlined (docs/performance.md). Applies to the
# private local Ray; a joined cluster keeps its own setting.
INLINE_OBJECT_BYTES = 1024 * 1024


@dataclass
class RaySession:
    """A connection to Ray that knows whether this process started the cluster."""

    started_here: bool
    address: str | None
    connected_here: bool = True

    def shutdown(self) -> None:
        """Disconnect; a cluster started here goes down with it, a joined one stays up.

        A session that found Ray already initialised by its caller leaves that connection alone.
        """
        import ray  # ray: only when the ray backend starts, off the CLI's fast path

        if self.connected_here and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> "RaySession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _driver_import_path() -> str:
    """The driver's import path, so local workers can import user code the driver can (recipes' worker:)."""
    entries = [os.getcwd()] + [p for p in sys.path if p and os.path.isdir(p)]
    existing = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(dict.fromkeys(entries + ([existing] if existing else [])))


def start_or_join_ray(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None,
                      dashboard: bool = False, env_vars: dict[str, str] | None = None) -> RaySession:
    """Join ``address`` (or RAY_ADDRESS) when given; otherwise start a private local Ray, dashboard off."""
    import ray  # ray: only when the ray backend starts, off the CLI's fast path

    address = address or os.environ.get("RAY_ADDRESS") or None
    # rlhfctl's own switches (every RLHFCTL_* variable) set on the driver reach every worker.
    env = {key: value for key, value in os.environ.items() if key.startswith("RLHFCTL_")}
    env.update(quiet_environment())  # libraries' own bars and advisories stay off the console (rlhfctl.library_output)
    env.update(env_vars or {})
    if ray.is_initialized():
        return RaySession(started_here=False, address=address, connected_here=False)
    if address:
        ray.init(address=address, runtime_env={"env_vars": env} if env else None, logging_level="WARNING",
                 log_to_driver=True)
        return RaySession(started_here=False, address=address)
    env.setdefault("PYTHONPATH", _driver_import_path())
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    with _ray_processes_in_their_own_session(), _quiet_token_auth_notice():
        _init_private_ray(num_cpus, num_gpus, dashboard, env)
    return RaySession(started_here=True, address=None)


def _init_private_ray(num_cpus: int | None, num_gpus: int | None, dashboard: bool, env: dict[str, str]) -> None:
    """``ray.init`` of a new local cluster: ``address="local"`` never joins one found on the machine."""
    import ray  # ray: only when the ray backend starts

    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=dashboard,
        dashboard_host="127.0.0.1",
        runtime_env={"env_vars": env},
        logging_level="WARNING",
        configure_logging=True,
        _system_config={"max_direct_call_object_size": INLINE_OBJECT_BYTES},
    )


class _DropTokenAuthNotice(logging.Filter):
    """Drops Ray's "Token authentication is enabled for this Ray cluster" notice (and only that record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Token authentication is enabled for this Ray cluster")


@contextlib.contextmanager
def _quiet_token_auth_notice() -> Iterator[None]:
    """Ray enables token authentication for a new local cluster and says so on every run; the private
    cluster keeps it on, without the line (it is about Ray's defaults, not about this run)."""
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    notice = _DropTokenAuthNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)


@contextlib.contextmanager
def _ray_processes_in_their_own_session() -> Iterator[None]:
    """Start the private Ray's processes (GCS, raylet, and the workers they spawn) in a session of their own.

    A signal sent to the driver's process group (a scheduler stopping the job, Ctrl-C in a shell)
    then reaches the driver alone, which saves and shuts Ray down in order; otherwise the raylet dies
    first and the driver aborts. Only where the kernel ties each process to its parent's death (Linux),
    so nothing outlives a driver that is killed outright; elsewhere Ray starts them as it always does.
    """
    from ray._private import services, utils  # ray: only when the ray backend starts

    original = getattr(services, "ConsolePopen", None)
    if original is None or not sys.platform.startswith("linux") or not utils.detect_fate_sharing_support():
        yield
        return

    class _OwnSessionPopen(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    services.ConsolePopen = _OwnSessionPopen
    try:
        yield
    finally:
        services.ConsolePopen = original
