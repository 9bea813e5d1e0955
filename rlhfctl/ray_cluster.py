"""Start a private local Ray, or join an existing cluster, and always clean up what we started."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

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
        import ray

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
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    # rlhfctl's own switches (every RLHFCTL_* variable) set on the driver reach every worker.
    env = {key: value for key, value in os.environ.items() if key.startswith("RLHFCTL_")}
    env.update(env_vars or {})
    if ray.is_initialized():
        return RaySession(started_here=False, address=address, connected_here=False)
    if address:
        ray.init(address=address, runtime_env={"env_vars": env} if env else None, logging_level="WARNING",
                 log_to_driver=True)
        return RaySession(started_here=False, address=address)
    env.setdefault("PYTHONPATH", _driver_import_path())
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    ray.init(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=dashboard,
        dashboard_host="127.0.0.1",
        runtime_env={"env_vars": env},
        logging_level="WARNING",
        configure_logging=True,
        _system_config={"max_direct_call_object_size": INLINE_OBJECT_BYTES},
    )
    return RaySession(started_here=True, address=None)
