"""SFTWorker: supervised fine-tuning of the policy on demonstrations (loss on the tokens ``loss_mask`` marks).

It is a :class:`workers.policy_model.PolicyModelWorker` (the actor's model, LoRA, DDP/FSDP2, optimizer,
scheduler, checkpoints and ``export_hf``, without its rollout) with two registered methods of its own:

- ``train_sft(batch)``: one optimizer step on the batch (micro-batched with gradient accumulation by
  ``roles.actor.micro_batch_size``), the loss being the mean negative log-likelihood over **all
  learned tokens of the whole batch, across ranks** (not a mean of per-row means);
- ``eval_sft(batch)``: per-row ``nll_sum`` and ``tokens``, so the driver computes the exact mean.

Batches hold ``input_ids``, ``attention_mask``, ``position_ids`` and ``loss_mask`` (1 on the tokens to
predict: a demonstration's response, or every assistant turn of a chat, not the user, system and tool
turns between them), right-padded, as :func:`rlhfctl.data.pairs.collate_demonstrations` makes them. The
worker reads the mask as it is, so it need not be one span per row. With
``meta_info["packed"]`` the attention mask is left out so transformers keeps attention within each
packed demonstration (it finds them from the restarting ``position_ids``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import Dispatch, register
from workers.policy_model import PolicyModelWorker
from rlhfctl.engine.forward import lm_forward
from rlhfctl.engine.offload import on_device
from rlhfctl.engine.placement import serving
from rlhfctl.engine.packing import packed_token_nll
from rlhfctl.engine.training import allreduce_mean, distributed

__all__ = ["SFT_KEYS", "SFTWorker", "token_nll"]

SFT_KEYS = ("input_ids", "attention_mask", "position_ids", "loss_mask")


def token_nll(
    model: nn.Module, batch: Mapping[str, torch.Tensor], packed: bool = False, padding_free: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token negative log-likelihood (B, T-1) of ``input_ids[:, 1:]`` and its mask ``loss_mask[:, 1:]``.

    With ``padding_free`` the rows run packed into one (``rlhfctl.engine.packing``), scoring only the masked-in
    tokens (0 elsewhere).
    """
    if padding_free:
        return packed_token_nll(model, batch)
    attention_mask = None if packed else batch["attention_mask"]
    output = lm_forward(model, batch["input_ids"], attention_mask, batch["position_ids"], use_cache=False)
    logits = output.logits[:, :-1].float()
    targets = batch["input_ids"][:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return nll.view(targets.shape), batch["loss_mask"][:, 1:].to(nll.dtype)


def _global_sum(value: float, device: torch.device) -> float:
    if not distributed():
        return value
    total = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return float(total.item())


class SFTWorker(PolicyModelWorker):
    """The policy trained on demonstrations: ``train_sft``, ``eval_sft``, plus the policy model's set-up,
    checkpoints and export."""

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def train_sft(self, batch: DataProto) -> dict[str, float]:
        """One optimizer step; returns rank-averaged ``loss`` (token mean over the whole batch),
        ``tokens`` (learned tokens on this rank), ``grad_norm`` and ``lr``."""
        lr = self._start_update(batch, SFT_KEYS, "train_sft")
        mask = batch.batch["loss_mask"][:, 1:]
        local_tokens = float(mask.sum().item())
        global_tokens = _global_sum(local_tokens, self.device)
        if global_tokens == 0:
            raise ValueError("train_sft got a batch without tokens to learn (loss_mask is all zero)")
        # optimize_on_batch weighs each micro-batch's token mean by its share of this rank's tokens and DDP
        # averages over ranks, so this factor makes the gradient that of the token sum over the global count.
        scale = local_tokens * self.world_size / global_tokens
        packed = bool(batch.meta_info.get("packed", False))
        padding_free = self.padding_free(self.module)

        def loss_fn(micro_batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            nll, weight = token_nll(self.model, micro_batch, packed=packed, padding_free=padding_free)
            loss = (nll * weight).sum() / weight.sum().clamp_min(1.0) * scale
            return loss, {"loss": loss.detach()}

        metrics = self._optimize(
            {key: batch.batch[key] for key in SFT_KEYS}, loss_fn, stream="sft", micro_batch_rows=self.config["micro_batch_size"],
            row_tokens=batch.batch["attention_mask"].sum(-1), loss_tokens=mask.sum(-1),
        )
        averaged = allreduce_mean({"loss": metrics["loss"], "grad_norm": metrics["grad_norm"]}, self.device)
        return {**averaged, "tokens": local_tokens, "lr": lr}

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    @on_device
    def eval_sft(self, batch: DataProto) -> DataProto:
        """Per row: ``nll_sum`` (summed over its learned tokens) and ``tokens``; no gradients."""
        self._require_model()
        self._require_keys(batch, SFT_KEYS, "eval_sft")
        packed = bool(batch.meta_info.get("packed", False))
        padding_free = self.padding_free(self.module)
        self.module.eval()
        step = int(self.config["micro_batch_size"] or len(batch))
        sums, counts = [], []
        with serving(self.module, self.engine), torch.no_grad():
            for start in range(0, len(batch), step):
                micro = {key: batch.batch[key][start : start + step].to(self.device) for key in SFT_KEYS}
                nll, weight = token_nll(self.module, micro, packed=packed, padding_free=padding_free)
                sums.append((nll * weight).sum(-1).cpu())
                counts.append(weight.sum(-1).cpu())
        return DataProto.from_dict({"nll_sum": torch.cat(sums).double(), "tokens": torch.cat(counts).double()})
