"""Resource pools: how many worker processes run on which nodes, with or without GPUs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlhfctl.single_controller.errors import ResourcePoolError

PLACEMENT_STRATEGIES = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")


@dataclass
class ResourcePool:
    """Processes per node; a rank is one process (one GPU when ``use_gpu``)."""

    process_on_nodes: list[int]
    use_gpu: bool = False
    max_colocate_count: int = 4
    name: str = "pool"

    def __post_init__(self) -> None:
        self.process_on_nodes = [int(n) for n in self.process_on_nodes]
        if not self.process_on_nodes or any(n < 1 for n in self.process_on_nodes):
            raise ValueError(f"process_on_nodes must list at least one node with >= 1 process, got {self.process_on_nodes}")
        if self.max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {self.max_colocate_count}")

    @property
    def world_size(self) -> int:
        """Total processes (ranks) in the pool."""
        return sum(self.process_on_nodes)

    def rank_layout(self) -> list[tuple[int, int, int]]:
        """(node index, local rank, processes on that node) for each global rank, node by node."""
        layout = []
        for node_index, count in enumerate(self.process_on_nodes):
            layout.extend((node_index, local_rank, count) for local_rank in range(count))
        return layout


@dataclass
class RayResourcePool(ResourcePool):
    """A ResourcePool backed by Ray placement groups: one per node entry, a bundle per process.

    Each bundle reserves ``num_cpus_per_process`` CPUs (and one GPU with ``use_gpu``); up to
    ``max_colocate_count`` separate worker groups may share a bundle, each taking a share of it.
    """

    num_cpus_per_process: float | None = None
    strategy: str = "STRICT_PACK"
    ready_timeout_s: float = 60.0
    _placement_groups: list[Any] | None = field(default=None, repr=False)

    def __init__(
        self,
        process_on_nodes: list[int],
        use_gpu: bool = False,
        max_colocate_count: int = 4,
        name: str = "pool",
        num_cpus_per_process: float | None = None,
        strategy: str = "STRICT_PACK",
        ready_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(list(process_on_nodes), use_gpu, max_colocate_count, name)
        if strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"placement strategy must be one of {PLACEMENT_STRATEGIES}, got {strategy!r}")
        # Small CPU reservations by default, so several pools fit a laptop-sized local Ray.
        self.num_cpus_per_process = num_cpus_per_process if num_cpus_per_process is not None else (1.0 if use_gpu else 0.5)
        self.strategy = strategy
        self.ready_timeout_s = ready_timeout_s
        self._placement_groups = None

    def bundle(self) -> dict[str, float]:
        """The resources one process slot reserves."""
        bundle = {"CPU": float(self.num_cpus_per_process)}
        if self.use_gpu:
            bundle["GPU"] = 1.0
        return bundle

    def actor_resources(self) -> dict[str, float]:
        """What one group's actor asks of its bundle (a 1/max_colocate_count share)."""
        share = {"num_cpus": self.num_cpus_per_process / self.max_colocate_count}
        if self.use_gpu:
            share["num_gpus"] = 1.0 / self.max_colocate_count
        return share

    def _check_capacity(self) -> None:
        import ray  # ray: only when the ray backend starts, off the CLI's fast path

        available = ray.available_resources()
        total = ray.cluster_resources()
        need_cpu = self.world_size * self.num_cpus_per_process
        need_gpu = self.world_size if self.use_gpu else 0
        short = []
        if need_cpu > available.get("CPU", 0.0) + 1e-9:
            short.append(f"CPU {need_cpu:g} needed, {available.get('CPU', 0.0):g} free of {total.get('CPU', 0.0):g}")
        if need_gpu > available.get("GPU", 0.0) + 1e-9:
            short.append(f"GPU {need_gpu} needed, {available.get('GPU', 0.0):g} free of {total.get('GPU', 0.0):g}")
        if short:
            raise ResourcePoolError(
                f"resource pool '{self.name}' (process_on_nodes={self.process_on_nodes}, use_gpu={self.use_gpu}) "
                f"does not fit the Ray cluster: {'; '.join(short)}. Lower process_on_nodes or "
                "num_cpus_per_process, or start Ray with more resources (ray.num_cpus / ray.num_gpus)."
            )

    def placement_groups(self) -> list[Any]:
        """The pool's placement groups, created (and waited for, bounded) on first use."""
        if self._placement_groups is not None:
            return self._placement_groups
        import ray  # ray: only when the ray backend starts, off the CLI's fast path

        self._check_capacity()
        groups: list[Any] = []
        try:
            for count in self.process_on_nodes:
                groups.append(self._place_on_a_new_node(count, groups))
        except BaseException:
            for pg in groups:
                ray.util.remove_placement_group(pg)
            raise
        self._placement_groups = groups
        return groups

    def _place_on_a_new_node(self, count: int, placed: list[Any]) -> Any:
        """One node entry's bundles, on a node none of the pool's earlier entries use (bounded wait)."""
        import ray  # ray: only when the ray backend starts, off the CLI's fast path
        from ray.util.placement_group import placement_group, placement_group_table  # as above

        used = sorted({node for pg in placed for node in placement_group_table(pg)["bundles_to_node_id"].values()})
        selector = [{"ray.io/node-id": f"!in({','.join(used)})"}] * count if used else None
        pg = placement_group([self.bundle() for _ in range(count)], strategy=self.strategy, bundle_label_selector=selector)
        ready, _ = ray.wait([pg.ready()], timeout=self.ready_timeout_s)
        if not ready:
            ray.util.remove_placement_group(pg)
            raise ResourcePoolError(
                f"resource pool '{self.name}' could not be placed within {self.ready_timeout_s:g} s: node entry "
                f"{len(placed)} of {self.process_on_nodes} needs {count} process(es) of {self.bundle()} "
                f"({self.strategy}) on a node of its own; the cluster has {len(ray.nodes())} node(s) with "
                f"{ray.cluster_resources()}"
            )
        return pg

    def node_ids(self) -> list[str]:
        """The Ray node id of each node entry (after placement)."""
        from ray.util.placement_group import placement_group_table  # ray: only with the ray backend

        return [next(iter(placement_group_table(pg)["bundles_to_node_id"].values())) for pg in self.placement_groups()]

    def release(self) -> None:
        """Remove the placement groups (the group's actors must be gone first)."""
        if not self._placement_groups:
            return
        import ray  # ray: only when the ray backend starts, off the CLI's fast path

        for pg in self._placement_groups:
            try:
                ray.util.remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - already gone with the cluster
                pass
        self._placement_groups = None
