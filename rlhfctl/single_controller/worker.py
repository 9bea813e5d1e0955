"""Worker: the base class of role workers; knows its place in the group and sets up torch.distributed."""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rlhfctl.single_controller.decorator import Dispatch, Execute, register
from rlhfctl.single_controller.gloo_interface import pin_gloo_interface


@dataclass(frozen=True)
class RankInfo:
    """Where one worker process sits in its group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0

    def env(self) -> dict[str, str]:
        """The environment variables torch.distributed's env:// rendezvous reads."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    @classmethod
    def from_env(cls) -> "RankInfo":
        """Read the variables a launcher (our groups, torchrun) set; defaults describe a lone process."""
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
            master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(os.environ.get("MASTER_PORT", 0)),
        )


# The variables a group sets in each worker process itself (read from RankInfo.env, their one home):
# a role's env_vars may not name them, or the group would silently replace the user's value.
GROUP_ENV_VARS: tuple[str, ...] = tuple(RankInfo().env())


# Set by a group while it constructs a worker, so workers built in one process (the local backend)
# each see their own rank without touching os.environ.
_constructing_rank: RankInfo | None = None


def free_port() -> int:
    """A TCP port that is free on this machine right now (for the rank-0 rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def ray_node_id() -> str | None:
    """The Ray node id of this process, or None outside Ray."""
    try:
        import ray  # ray: only under the ray backend, off the CLI's fast path

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - not under Ray
        pass
    return None


def node_ip_address() -> str:
    """This node's address as the cluster sees it (Ray's view when running under Ray)."""
    try:
        import ray  # ray: only under the ray backend

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - fall back to the loopback for a driver-local process
        pass
    return "127.0.0.1"


class Worker:
    """Base class for role workers: plain single-process code plus ``@register`` on group-callable methods."""

    def __init__(self) -> None:
        self._rank_info = _constructing_rank or RankInfo.from_env()

    @property
    def rank(self) -> int:
        return self._rank_info.rank

    @property
    def world_size(self) -> int:
        return self._rank_info.world_size

    @property
    def local_rank(self) -> int:
        return self._rank_info.local_rank

    @property
    def master_addr(self) -> str:
        return self._rank_info.master_addr

    @property
    def master_port(self) -> int:
        return self._rank_info.master_port

    def init_distributed(self, backend: str | None = None, timeout_s: float = 600.0) -> Any:
        """Join the group's torch.distributed process group (gloo on CPU, nccl on CUDA); idempotent."""
        if dist.is_initialized():
            return dist.group.WORLD
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        info = self._rank_info
        # Before any group exists: every gloo group this process makes (the default one on CPU, side groups
        # for async checkpoints and vLLM's world) binds where the other nodes can reach it.
        pin_gloo_interface(node_ip_address(), info.master_addr)
        if backend == "nccl":
            torch.cuda.set_device(torch.device("cuda", 0 if torch.cuda.device_count() == 1 else info.local_rank))
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{info.master_addr}:{info.master_port}",
            rank=info.rank,
            world_size=info.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        return dist.group.WORLD

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe_process(self) -> dict[str, Any]:
        """Rank, pid, node and torch threads of this worker: used by tests, ``workers.json`` and benchmarks to show
        placement and that each process runs the threads its pool reserved."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "pid": os.getpid(),
            "node_ip": node_ip_address(),
            "node_id": ray_node_id(),
            "class": type(self).__name__,
            "torch_threads": torch.get_num_threads(),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.ALL)
    def shutdown_worker(self) -> None:
        """Release process-wide resources (the torch.distributed group) before the process ends."""
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass
