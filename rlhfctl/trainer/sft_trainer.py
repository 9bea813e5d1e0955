"""SFT: fine-tune the policy on demonstrations, loss on the learned tokens only (the response, or every assistant turn of a chat) (``algorithm.name: sft``).

The trained role is ``roles.actor`` with ``worker: workers.sft.SFTWorker``. Metrics per step: ``loss``
(mean negative log-likelihood per response token over the whole batch), ``grad_norm``, ``lr``,
``tokens/response``, ``perf/tokens_per_s``, ``time/step``; ``eval/loss`` on the held-out
demonstrations.
"""

from __future__ import annotations

import time
from typing import Any

from rlhfctl.data.pairs import Demonstration, DemonstrationDataset, collate_demonstrations
from rlhfctl.protocol import DataProto
from rlhfctl.trainer.metrics import mean_over_ranks
from rlhfctl.trainer.stage_trainer import StageTrainer

__all__ = ["SFTTrainer"]


class SFTTrainer(StageTrainer):
    """Drives ``actor.train_sft`` / ``actor.eval_sft`` over demonstrations."""

    algorithm = "sft"
    trained_role = "actor"
    record_kind = "demonstrations"

    def make_dataset(self, records: list[dict[str, Any]], source: str) -> DemonstrationDataset:
        """Tokenize demonstrations with the recipe's data keys and length limit."""
        return DemonstrationDataset.from_data_section(records, self.tokenizer, self.recipe.data, source)

    def collate(self, rows: list[Demonstration]) -> DataProto:
        """Right-padded (optionally packed) rows with their loss mask."""
        data = self.recipe.data
        tensors = collate_demonstrations(rows, self.tokenizer.pad_token_id, packing=bool(data.packing), max_length=data.max_length)
        return DataProto.from_dict(tensors, meta_info={"packed": bool(data.packing)})

    def train_on(self, rows: list[Demonstration]) -> dict[str, float]:
        """One ``train_sft`` call."""
        batch = self.collate(rows)
        start = time.perf_counter()
        metrics = mean_over_ranks(self.trained.train_sft(batch))
        elapsed = time.perf_counter() - start
        metrics.pop("tokens", None)  # per rank, padding rows included; the batch's own count is exact
        metrics["tokens/response"] = float(batch.batch["loss_mask"][:, 1:].sum())
        metrics["perf/tokens_per_s"] = float(batch.batch["attention_mask"].sum()) / max(elapsed, 1e-9)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """``eval/loss``: mean negative log-likelihood per response token over all held-out demonstrations."""
        total, tokens = 0.0, 0.0
        for rows in self.eval_chunks():
            scored = self.trained.eval_sft(self.collate(rows))
            total += float(scored.batch["nll_sum"].sum())
            tokens += float(scored.batch["tokens"].sum())
        return {"eval/loss": total / max(tokens, 1.0), "eval/tokens": tokens}
