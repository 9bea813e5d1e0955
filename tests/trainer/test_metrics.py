"""Step and validation metrics computed from a batch on the driver."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.trainer.metrics import batch_metrics, validation_metrics


def test_clip_ratio_is_the_share_of_responses_that_used_every_new_token():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    batch = DataProto.from_dict(tensors={
        "response_mask": mask, "attention_mask": torch.cat([torch.ones(4, 3, dtype=torch.long), mask], dim=1),
        "token_level_scores": torch.zeros(4, 4), "advantages": torch.zeros(4, 4), "returns": torch.zeros(4, 4),
    })
    metrics = batch_metrics(batch)
    assert metrics["response_length/clip_ratio"] == pytest.approx(0.5)
    assert metrics["response_length/max"] == 4


def test_validation_metrics_per_data_source():
    scores = np.array([1.0, 0.0, 0.5, 0.5, 1.0])
    sources = np.array(["gsm8k", "math", "gsm8k", "math", "gsm8k"], dtype=object)
    metrics = validation_metrics(scores, sources)
    assert metrics["val/reward/mean"] == pytest.approx(0.6) and metrics["val/samples"] == 5
    assert metrics["val/gsm8k/reward/mean"] == pytest.approx(2.5 / 3) and metrics["val/gsm8k/samples"] == 3
    assert metrics["val/math/reward/mean"] == pytest.approx(0.25)
    assert set(validation_metrics(scores, None)) == {"val/reward/mean", "val/samples"}


def test_pass_at_k_is_the_best_accuracy_of_each_prompts_k_responses_averaged_over_prompts():
    # Prompts p0 (gsm8k), p1 (gsm8k), p2 (math), 2 responses each.
    accuracy = np.array([0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    groups = np.array(["p0", "p0", "p1", "p1", "p2", "p2"], dtype=object)
    sources = np.array(["gsm8k"] * 4 + ["math"] * 2, dtype=object)
    metrics = validation_metrics(accuracy, sources, accuracy=accuracy, groups=groups, k=2)
    assert metrics["val/pass@2"] == pytest.approx(2 / 3)  # p0 and p2 solved at least once
    assert metrics["val/gsm8k/pass@2"] == pytest.approx(0.5) and metrics["val/math/pass@2"] == 1.0
    assert metrics["val/gsm8k/reward/mean"] == pytest.approx(0.25)
    assert "val/pass@2" not in validation_metrics(accuracy, sources)
