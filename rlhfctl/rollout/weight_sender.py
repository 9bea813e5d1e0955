"""The actor's end of the weight channel (``rollout.placement: separate``): open it, send the weights, check a sync.

Every actor rank takes part in a send (an FSDP2 shard is gathered by all ranks, bucket by bucket, cast
to the engine's dtype, ``rollout.dtype``, first); rank 0 alone broadcasts the buckets to the rollout ranks.
"""

from __future__ import annotations

import time
from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import Dispatch, register
from rlhfctl.single_controller.worker import free_port, node_ip_address
from rlhfctl.engine.placement import ONE_TO_ALL_FIRST, compute_dtype
from rlhfctl.rollout import vllm_engine
from rlhfctl.rollout.weight_channel import SyncAddress, WeightChannel, bucketed

__all__ = ["WeightSender"]


class WeightSender:
    """Mixed into the actor: ``open_weight_sync``, ``join_weight_sync``, ``send_weights`` and ``check_weight_sync``."""

    weight_channel: WeightChannel | None = None

    @register(dispatch_mode=ONE_TO_ALL_FIRST)
    def open_weight_sync(self, receivers: int) -> SyncAddress:
        """The address of a new channel served by this group's rank 0, for ``receivers`` rollout ranks."""
        return SyncAddress(node_ip_address(), free_port(), 1 + int(receivers))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_weight_sync(self, address: SyncAddress) -> None:
        """Rank 0 joins the channel as its sender (the other ranks only gather during a send)."""
        if self.rank == 0:
            timeout = float(self.recipe.trainer.call_timeout_s)
            self.weight_channel = WeightChannel(address, 0, self.device, timeout)

    @register(dispatch_mode=ONE_TO_ALL_FIRST)
    def send_weights(self) -> dict[str, float]:
        """Send the current weights to the rollout ranks; ``time/weight_sync`` and ``rollout/sync_bytes``
        (weights in the engine's dtype) and the ``version`` they are (the updates taken so far)."""
        self._require_model()
        start = time.perf_counter()
        bucket = int(float(vllm_engine.engine_settings(self.rollout)["sync_bucket_mib"]) * 2**20)  # rollout.vllm.sync_bucket_mib
        weights = vllm_engine.gathered_weights(self.module, bucket, compute_dtype(self.recipe.rollout.dtype))
        sent = 0
        if self.rank == 0:
            if self.weight_channel is None:
                raise RuntimeError(f"{self.role} rank 0: send_weights before join_weight_sync")
            sent = self.weight_channel.send(bucketed(weights, bucket))
        else:
            for _ in weights:  # the gathers are collectives: every rank walks the same buckets
                pass
        return {"time/weight_sync": time.perf_counter() - start, "rollout/sync_bytes": float(sent),
                "version": float(self.update_calls)}

    @register(dispatch_mode=ONE_TO_ALL_FIRST)
    def check_weight_sync(self, probe: DataProto) -> dict[str, float]:
        """``rollout/sync_check_diff``: the mean |log-prob| gap between the actor and the rollout engine on ``probe``."""
        self._require_model()
        diff, _ = self._probe_gap(probe)
        return {"rollout/sync_check_diff": diff}
