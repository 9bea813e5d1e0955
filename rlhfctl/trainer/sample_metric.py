"""One number per sample from a scored batch, by name: what DAPO's group filter and validation's pass@k compare.

The names a recipe may use (``algorithm.filter_groups.metric``):

- ``score``: the sequence reward, ``token_level_scores`` summed (with the overlong penalty, when on);
- ``acc``: the reward function's named ``acc`` score when it returns one, else its raw score (verl's
  DAPO reward manager records a plain float return as ``acc`` the same way);
- any other name: a named score the reward function returns (``reward/<name>`` columns).
"""

from __future__ import annotations

import numpy as np
import torch

from rlhfctl.errors import UserError
from rlhfctl.protocol import DataProto
from rlhfctl.tasks.reward_fn import named_score_column, named_score_names

__all__ = ["BUILT_IN_METRICS", "MissingRewardMetric", "named_scores", "sample_metric"]

BUILT_IN_METRICS = ("score", "acc")
"""The metrics every scored batch has, whatever the reward function returns (see the module doc)."""


class MissingRewardMetric(UserError, KeyError):
    """A recipe names a per-sample metric that the reward function does not return."""

    def __str__(self) -> str:
        return str(self.args[0])


def sample_metric(batch: DataProto, metric: str, key: str = "algorithm.filter_groups.metric") -> np.ndarray:
    """The metric ``metric`` of every sample of ``batch`` as float64 (see the module doc for the names)."""
    columns = batch.non_tensor_batch
    if metric == "score":
        return batch.batch["token_level_scores"].sum(-1).double().numpy()
    column = named_score_column(metric)
    if column in columns:
        return np.asarray(columns[column], dtype=np.float64)
    if metric == "acc" and "score" in columns:
        return np.asarray(columns["score"], dtype=np.float64)
    names = ", ".join(dict.fromkeys([*BUILT_IN_METRICS, *named_score_names(columns)]))
    raise MissingRewardMetric(
        f"{key}: the reward function returns no {metric!r} score; it gives: {names} (return a dict per sample "
        f"with a {metric!r} entry, or choose one of those)"
    )


def named_scores(batch: DataProto) -> dict[str, torch.Tensor]:
    """Every named score of the reward function, one float32 per sample (what gdpo normalizes one by one)."""
    columns = batch.non_tensor_batch
    return {
        name: torch.as_tensor(np.asarray(columns[named_score_column(name)], dtype=np.float32))
        for name in named_score_names(columns)
    }
