"""The Ray backend: each rank is a Ray actor (a WorkerHost) placed in its resource pool's bundle."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from rlhfctl.library_output import strip_ansi
from rlhfctl.single_controller.errors import WorkerDiedError, WorkerTimeoutError, method_error
from rlhfctl.single_controller.host import ClassWithInitArgs, direct_method_name, host_class_for, torch_threads_for
from rlhfctl.single_controller.resource_pool import RayResourcePool
from rlhfctl.single_controller.worker import GROUP_ENV_VARS, RankInfo
from rlhfctl.single_controller.worker_group import WorkerGroup, payload_bytes

BUILD_TIMEOUT_S = 600.0


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class, its constructor arguments, and per-role process options for Ray."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        super().__init__(cls, *args, **kwargs)
        self.env_vars: dict[str, str] = {}
        self.num_cpus: float | None = None
        self.num_gpus: float | None = None
        self.num_threads: int | None = None

    def with_options(self, env_vars: dict[str, str] | None = None, num_cpus: float | None = None,
                     num_gpus: float | None = None, num_threads: int | None = None) -> "RayClassWithInitArgs":
        """Set environment variables, CPU/GPU requests and torch threads for this role's processes; returns self.

        Raises ValueError for a variable the group sets in every worker itself (``GROUP_ENV_VARS``).
        """
        reserved = sorted(set(env_vars or {}) & set(GROUP_ENV_VARS))
        if reserved:
            raise ValueError(
                f"env_vars sets {', '.join(reserved)}, which the worker group sets itself in every worker "
                f"(reserved: {', '.join(GROUP_ENV_VARS)}); remove it from env_vars"
            )
        self.env_vars.update(env_vars or {})
        self.num_threads = num_threads if num_threads is not None else self.num_threads
        self.num_cpus = num_cpus if num_cpus is not None else self.num_cpus
        self.num_gpus = num_gpus if num_gpus is not None else self.num_gpus
        return self


class _RayHosts:
    """The Ray actors of one pool allocation, shared by colocated groups; killed once."""

    def __init__(self, handles: list[Any], pids: list[int]) -> None:
        self.handles = handles
        self.pids = pids
        self.alive = True

    def kill(self) -> None:
        if not self.alive:
            return
        import ray  # ray: only when the ray backend starts, off the CLI's fast path

        for handle in self.handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead or cluster gone
                pass
        self.alive = False


def _spawn_hosts(pool: RayResourcePool, roles: dict[str, ClassWithInitArgs], name: str) -> _RayHosts:
    """Start one WorkerHost actor per rank in the pool's bundles and build the roles' workers in it."""
    import ray  # ray: only when the ray backend starts, off the CLI's fast path
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # as above

    placement_groups = pool.placement_groups()
    env_vars: dict[str, str] = {}
    resources = pool.actor_resources()
    num_threads = None
    for spec in roles.values():
        if isinstance(spec, RayClassWithInitArgs):
            env_vars.update(spec.env_vars)
            num_threads = spec.num_threads or num_threads
            if spec.num_cpus is not None:
                resources["num_cpus"] = spec.num_cpus
            if spec.num_gpus is not None:
                resources["num_gpus"] = spec.num_gpus
    remote_host = ray.remote(host_class_for(roles))
    handles = []
    for rank, (node_index, local_rank, _) in enumerate(pool.rank_layout()):
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=placement_groups[node_index], placement_group_bundle_index=local_rank
        )
        handles.append(
            remote_host.options(scheduling_strategy=strategy, name=None, max_concurrency=1, **resources).remote(env_vars)
        )
    hosts = _RayHosts(handles, [])
    worker_class = ", ".join(spec.cls.__name__ for spec in roles.values())
    try:
        master_addr, master_port = _wait_for([handles[0].rendezvous_address.remote()], [0], name, "__init__",
                                             BUILD_TIMEOUT_S, worker_class)[0]
        build_refs = []
        for rank, (node_index, local_rank, local_count) in enumerate(pool.rank_layout()):
            info = RankInfo(rank, pool.world_size, local_rank, local_count, master_addr, master_port)
            build_refs.append(handles[rank].build.remote(info, roles, num_threads or torch_threads_for(local_count)))
        hosts.pids = _wait_for(build_refs, list(range(len(handles))), name, "__init__", BUILD_TIMEOUT_S, worker_class)
    except BaseException:
        hosts.kill()  # never leave half-started actors behind
        raise
    return hosts


def _wait_for(refs: list[Any], ranks: list[int], role: str, method: str, timeout: float, worker_class: str) -> list[Any]:
    """Wait for every rank, bounded by ``timeout``; the first error or death raises at once, naming its rank.

    ``ray.get`` on the list returns as soon as any rank fails, so the common path is one call.
    """
    import ray  # ray: only when the ray backend starts, off the CLI's fast path

    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
        pending_ranks = [rank for rank, ref in zip(ranks, refs) if ref in set(pending)]
        raise WorkerTimeoutError(role, method, timeout, pending_ranks) from None
    except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError):
        # A short grace so that ranks failing together are all seen and the lowest one is named.
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=1.0)
        _raise_first_failure(ready, refs, ranks, role, method, worker_class)
        raise


def _raise_first_failure(ready: list[Any], refs: list[Any], ranks: list[int], role: str, method: str,
                         worker_class: str) -> None:
    """Raise a named error for the lowest failed rank among ``ready``; a rank whose process died comes first, since
    its peers' errors (a collective whose other end is gone) are usually its doing."""
    import ray  # ray: only when the ray backend starts, off the CLI's fast path

    rank_of = dict(zip(refs, ranks))
    in_order = sorted(ready, key=lambda r: rank_of[r])
    for ref in in_order:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as error:
            raise WorkerDiedError(role, method, rank_of[ref], _first_line(error)) from None
        except ray.exceptions.RayTaskError:
            continue
    for ref in in_order:
        try:
            ray.get(ref)
        except ray.exceptions.RayTaskError as error:
            cause = error.cause if getattr(error, "cause", None) is not None else error
            detail = f"{type(cause).__name__}: {cause}" if cause is not error else _first_line(error)
            raise method_error(role, worker_class, method, rank_of[ref], cause, detail, strip_ansi(str(error))) from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


_SHARED_PUT_MIN_BYTES = 100 * 1024


def _put_shared_once(rank_args: list[tuple], rank_kwargs: list[dict]) -> tuple[list[tuple], list[dict]]:
    """Put a large argument that every rank receives (ONE_TO_ALL) in the object store once, not per rank.

    Ray resolves a top-level ObjectRef argument before the call, so the worker still gets the value.
    """
    import ray  # ray: only when the ray backend starts, off the CLI's fast path

    first_args, first_kwargs = rank_args[0], rank_kwargs[0]
    shared: dict[int, Any] = {}
    for value in list(first_args) + list(first_kwargs.values()):
        if id(value) in shared or payload_bytes(value) < _SHARED_PUT_MIN_BYTES:
            continue
        everywhere = all(any(v is value for v in args) or any(v is value for v in kwargs.values())
                         for args, kwargs in zip(rank_args, rank_kwargs))
        if everywhere:
            shared[id(value)] = ray.put(value)
    if not shared:
        return rank_args, rank_kwargs
    swap = lambda v: shared.get(id(v), v)  # noqa: E731 - tiny local mapping
    return ([tuple(swap(v) for v in args) for args in rank_args],
            [{k: swap(v) for k, v in kwargs.items()} for kwargs in rank_kwargs])


def _bound_rank_methods(handles: list[Any], role: str, methods: Iterable[str]) -> dict[str, list[Any]]:
    """Each registered method's direct host method on every rank, bound once: Ray binds a new method object
    on every attribute read of an actor handle (a few microseconds each). Methods without one are absent."""
    bound = {}
    for method in methods:
        direct = direct_method_name(role, method)
        if hasattr(handles[0], direct):
            bound[method] = [getattr(handle, direct) for handle in handles]
    return bound


class RayWorkerGroup(WorkerGroup):
    """A WorkerGroup whose ranks are Ray actors in a RayResourcePool."""

    backend = "ray"

    def __init__(self, resource_pool: RayResourcePool, ray_cls_with_init: ClassWithInitArgs, role: str = "worker",
                 call_timeout_s: float | None = None, _hosts: _RayHosts | None = None) -> None:
        if not isinstance(ray_cls_with_init, ClassWithInitArgs):
            ray_cls_with_init = RayClassWithInitArgs(ray_cls_with_init)
        super().__init__(role, ray_cls_with_init.cls, resource_pool.world_size, call_timeout_s)
        self.resource_pool = resource_pool
        self._hosts = _hosts or _spawn_hosts(resource_pool, {role: ray_cls_with_init}, role)
        self._rank_methods = _bound_rank_methods(self._hosts.handles, role, self.method_specs)

    @classmethod
    def create_colocated(cls, resource_pool: RayResourcePool, roles: dict[str, ClassWithInitArgs],
                         call_timeout_s: float | None = None) -> dict[str, "RayWorkerGroup"]:
        """Several roles in one process per rank; returns a group per role, each with its own methods."""
        if not roles:
            raise ValueError("create_colocated needs at least one role")
        roles = {role: spec if isinstance(spec, ClassWithInitArgs) else RayClassWithInitArgs(spec) for role, spec in roles.items()}
        hosts = _spawn_hosts(resource_pool, roles, "+".join(roles))
        return {role: cls(resource_pool, spec, role, call_timeout_s, _hosts=hosts) for role, spec in roles.items()}

    @property
    def pids(self) -> list[int]:
        """Process id of each rank."""
        return list(self._hosts.pids)

    @property
    def actor_handles(self) -> list[Any]:
        """The Ray actor of each rank (shared with colocated groups)."""
        return list(self._hosts.handles)

    def _launch(self, method: str, rank_args: list[tuple], rank_kwargs: list[dict], ranks: list[int]) -> list[Any]:
        if len(ranks) > 1:
            rank_args, rank_kwargs = _put_shared_once(rank_args, rank_kwargs)
        direct = self._rank_methods.get(method)
        if direct is not None:
            return [direct[rank].remote(*args, **kwargs) for rank, args, kwargs in zip(ranks, rank_args, rank_kwargs)]
        handles = self._hosts.handles
        return [handles[rank].call.remote(self.role, method, *args, **kwargs)
                for rank, args, kwargs in zip(ranks, rank_args, rank_kwargs)]

    def _wait(self, method: str, handles: list[Any], ranks: list[int], timeout: float | None) -> list[Any]:
        return _wait_for(handles, ranks, self.role, method, timeout or self.call_timeout_s, self.worker_cls.__name__)

    def _ready(self, handles: list[Any]) -> bool:
        import ray  # ray: only when the ray backend starts, off the CLI's fast path

        _, pending = ray.wait(list(handles), num_returns=len(handles), timeout=0)
        return not pending

    def drain_rank_spans(self) -> list[tuple[int, str, str, float, float]]:
        """(rank, role, method, start, end) recorded by each rank's host since the last drain.

        Colocated groups share hosts, so one drain returns the spans of every role on them.
        """
        return self.request_rank_spans()()

    def request_rank_spans(self) -> Callable[[float | None], list[tuple[int, str, str, float, float]]]:
        """Send each rank's drain now; the returned function waits for the answers (bounded)."""
        refs = [handle.drain_spans.remote() for handle in self._hosts.handles]

        def collect(timeout: float | None = None) -> list[tuple[int, str, str, float, float]]:
            per_rank = _wait_for(refs, list(range(len(refs))), self.role, "drain_spans", timeout or self.call_timeout_s,
                                 self.worker_cls.__name__)
            return [(rank, *span) for rank, spans in enumerate(per_rank) for span in spans]

        return collect

    def shutdown(self) -> None:
        """Kill this group's actors (and those of roles colocated with it)."""
        self._hosts.kill()
