"""``rlhfctl eval``'s work: a policy's responses to validation prompts, scored by the recipe's reward role.

The responses and scores come from :func:`rlhfctl.trainer.validation.respond_and_score`, the function behind
training's ``val/*`` metrics, and ``val_metrics`` is computed by the training's own ``scored_validation_metrics``: for a
run's checkpoint of step N, with the run's seed and pools, they equal what the run logged at step N.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlhfctl.data.errors import DataConfigError
from rlhfctl.evaluation.policy_groups import policy_groups
from rlhfctl.evaluation.policy_source import PolicySource
from rlhfctl.evaluation.report import eval_report
from rlhfctl.models.loading import load_tokenizer
from rlhfctl.protocol import DataProto
from rlhfctl.recipe.specs import Recipe
from rlhfctl.trainer.prompt_source import build_dataset
from rlhfctl.trainer.sample_metric import MissingRewardMetric, sample_metric
from rlhfctl.trainer.validation import respond_and_score, scored_validation_metrics

__all__ = ["Evaluation", "evaluate"]


@dataclass
class Evaluation:
    """What an evaluation found: the report per data source, the ``val/*`` metrics training would log, the samples."""

    policy: str
    step: int
    n: int
    report: dict[str, dict[str, Any]]
    val_metrics: dict[str, float]
    samples: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The ``--format json`` report (the samples go to ``--samples`` instead)."""
        return {"policy": self.policy, "step": self.step, "n": self.n, "sources": self.report, "val_metrics": self.val_metrics}


def evaluate(recipe: Recipe, source: PolicySource, n: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> Evaluation:
    """Score ``source``'s policy on the recipe's validation prompts, ``n`` responses each (default
    ``rollout.val_n``: one greedy response, as training validates)."""
    actor_model = recipe.role("actor").model
    tokenizer = load_tokenizer(actor_model, trust_remote_code=bool(actor_model.trust_remote_code))
    dataset = build_dataset(recipe, tokenizer, "val")
    if dataset is None or len(dataset) == 0:
        raise DataConfigError("data: no validation prompts; pass --data FILE, or set data.val_files or data.task")
    n = int(n or recipe.rollout.settings.val_n)
    rows = list(dataset)
    with policy_groups(recipe, source.checkpoint) as groups:
        batch = respond_and_score(rows, tokenizer, groups["actor"], groups["reward"], recipe.trainer.batch_size, n,
                                  source.step, progress)
    scores = batch.batch["token_level_scores"].sum(-1).double().numpy()
    sources, uids = batch.non_tensor_batch.get("data_source"), batch.non_tensor_batch["uid"]
    accuracy = _accuracy(batch)
    # training's own numbers; pass@k needs an acc, without one the mean is still reported
    val = scored_validation_metrics(batch, n if accuracy is not None else 1)
    correct = None if accuracy is None else (accuracy >= 1.0).astype(np.float64)
    report = eval_report(scores, uids, sources, n, correct=correct)
    return Evaluation(source.label, source.step, n, report, val, _samples(rows, batch, n, scores, accuracy))


def _accuracy(batch: DataProto) -> np.ndarray | None:
    """Each sample's ``acc`` (or the reward's ``score`` entry); None when the reward returns neither."""
    try:
        return sample_metric(batch, "acc")
    except MissingRewardMetric:
        return None


def _samples(rows: list[Any], batch: DataProto, n: int, scores: np.ndarray, accuracy: np.ndarray | None) -> list[dict[str, Any]]:
    """One record per response: the prompt, the response, its score (and acc), in prompt order."""
    texts = batch.non_tensor_batch["response_text"]
    lengths = batch.batch["response_mask"].sum(-1).tolist()
    sources = batch.non_tensor_batch.get("data_source")
    records = []
    for position, row in enumerate(rows):
        for sample in range(n):
            i = position * n + sample
            record = {"index": row.index, "sample": sample, "prompt": row.prompt_text, "response": str(texts[i]),
                      "score": float(scores[i]), "response_tokens": int(lengths[i])}
            if sources is not None:
                record["data_source"] = str(sources[i])
            if accuracy is not None:
                record["acc"] = float(accuracy[i])
            records.append(record)
    return records
