"""Joining rollout batches whose prompts were collated to different widths (each batch is left-padded to its own
longest prompt): the prompt columns of the narrower ones are left-padded to the widest, so every response stays at
the same columns; a padded column is masked, so no number changes. Dynamic sampling joins its generation batches so,
and validation its batches of held-out prompts."""

from __future__ import annotations

import torch

from rlhfctl.protocol import DataProto

__all__ = ["LEFT_PADDED", "concat_prompt_padded"]

LEFT_PADDED = {"prompts": None, "input_ids": None, "attention_mask": 0, "position_ids": 0}
"""Columns that start with the prompt, left-padded, and what pads them (None: the pad token)."""


def concat_prompt_padded(parts: list[DataProto], pad_token_id: int) -> DataProto:
    """Join the non-empty parts row-wise, left-padding the prompt columns of narrower parts to the widest."""
    parts = [part for part in parts if len(part)]
    width = max(_prompt_width(part) for part in parts)
    return DataProto.concat([_left_pad(part, width - _prompt_width(part), pad_token_id) for part in parts])


def _prompt_width(part: DataProto) -> int:
    return int((part.batch["prompts"] if "prompts" in part.batch else part.batch["input_ids"]).shape[1])


def _left_pad(part: DataProto, extra: int, pad_token_id: int) -> DataProto:
    if extra == 0:
        return part
    tensors = dict(part.batch)
    for key, fill in LEFT_PADDED.items():
        if key in tensors:
            value = tensors[key]
            padding = value.new_full((value.shape[0], extra), pad_token_id if fill is None else fill)
            tensors[key] = torch.cat([padding, value], dim=1)
    return DataProto(batch=tensors, non_tensor_batch=dict(part.non_tensor_batch), meta_info=dict(part.meta_info))
