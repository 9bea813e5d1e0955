"""Actors that show what a rank loaded and in which dtypes it keeps its weights (rlhfctl/engine/sharded_load.py,
rlhfctl/models/loading.py cast_parameters), and export with a chosen file bound (rlhfctl/engine/hf_export.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rlhfctl.single_controller import Dispatch, register
from workers import ActorWorker, CriticWorker
from rlhfctl.engine.checkpointing import save_hf_directory


class LoadReportView:
    """A registered view of what this rank read from the checkpoint files (rlhfctl/engine/sharded_load.py)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_report(self) -> dict[str, Any] | None:
        """What this rank read from the checkpoint files (None: it did not load sharded)."""
        report = getattr(self.module, "load_report", None)
        return None if report is None else dataclasses.asdict(report)


class ShardedLoadCritic(LoadReportView, CriticWorker):
    """CriticWorker plus its load report."""


class ShardedLoadActor(LoadReportView, ActorWorker):
    """ActorWorker plus three views: the sharded load's report, the parameters' dtypes, a bounded export."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def parameter_dtypes(self) -> dict[str, str]:
        """``{name: dtype}`` of this rank's parameters (local shards under FSDP2)."""
        return {name: str(parameter.dtype) for name, parameter in self.module.named_parameters()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_bounded(self, directory: str, max_shard_bytes: int) -> str:
        """The Hugging Face export in the role's compute dtype, files of at most ``max_shard_bytes``."""
        return str(save_hf_directory(self.module, self.tokenizer, Path(directory), self.engine.compute_dtype, max_shard_bytes))


class FloatBaseLoraActor(ShardedLoadActor):
    """Yesterday's LoRA actor: every parameter, the frozen base too, cast to the float32 storage dtype."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """``ActorWorker.init_model`` with ``cast_parameters`` ignoring its frozen dtype, as before issue 35."""
        import rlhfctl.engine.placement as engine

        original = engine.cast_parameters
        engine.cast_parameters = lambda module, dtype, frozen_dtype=None: original(module, dtype)
        try:
            super().init_model()
        finally:
            engine.cast_parameters = original
