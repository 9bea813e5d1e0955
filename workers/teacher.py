"""TeacherWorker: the frozen teacher of on-policy distillation, scoring every token the policy sampled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import Dispatch, register
from rlhfctl.engine.offload import on_device
from workers.reference import ReferenceWorker

__all__ = ["TeacherWorker"]


class TeacherWorker(ReferenceWorker):
    """``roles.teacher``: its own model (an SFT stage's output, a larger model), built and placed as the reference is,
    answering in the reference's call shape with ``teacher_log_prob``."""

    default_role = "teacher"

    def __init__(self, recipe: Mapping[str, Any], role: str = "teacher") -> None:
        super().__init__(recipe, role)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of ``responses`` under the teacher: ``teacher_log_prob`` (B, R), at the rollout's temperature."""
        return DataProto.from_dict({"teacher_log_prob": self.frozen_log_probs(data, "compute_teacher_log_prob")})
