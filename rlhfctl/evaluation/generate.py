"""``rlhfctl generate``'s work: a policy's responses to a file of prompts, as records.

Prompts are read and rendered as training reads them (``data.prompt_key``, the chat template when
``data.apply_chat_template``, the tools of ``rollout.multi_turn``), and responses come from the actor's own
generation (:func:`rlhfctl.trainer.validation.respond`), with the recipe's engine and sampling settings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlhfctl.data.errors import DataConfigError
from rlhfctl.evaluation.policy_groups import policy_groups
from rlhfctl.evaluation.policy_source import PolicySource
from rlhfctl.models.loading import load_tokenizer
from rlhfctl.recipe.specs import Recipe
from rlhfctl.trainer.prompt_source import build_dataset
from rlhfctl.trainer.validation import respond

__all__ = ["generate_records"]


def generate_records(recipe: Recipe, source: PolicySource, n: int = 1, greedy: bool = False, log_probs: bool = False,
                     progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """One record per response to the recipe's ``data.val_files`` prompts: the prompt, the response, token counts,
    the record's other columns, and with ``log_probs`` each response token's log-prob under the policy."""
    actor_model = recipe.role("actor").model
    tokenizer = load_tokenizer(actor_model, trust_remote_code=bool(actor_model.trust_remote_code))
    dataset = build_dataset(recipe, tokenizer, "val")
    if dataset is None or len(dataset) == 0:
        raise DataConfigError("--data: the file has no prompts")
    rows, records = list(dataset), []
    do_sample = False if greedy else bool(recipe.rollout.settings.do_sample)
    with policy_groups(recipe, source.checkpoint) as groups:
        actor = groups["actor"]
        for chunk, responses in respond(rows, tokenizer, actor, recipe.trainer.batch_size, n, source.step, do_sample):
            scored = actor.compute_log_prob(responses).batch["old_log_probs"] if log_probs else None
            records.extend(_records(chunk, responses, n, scored))
            if progress is not None:
                progress(len(records) // n, len(rows))
    return records


def _records(rows: Any, responses: Any, n: int, log_probs: Any) -> list[dict[str, Any]]:
    texts = responses.non_tensor_batch["response_text"]
    masks = responses.batch["response_mask"]
    records = []
    for position, row in enumerate(rows):
        for sample in range(n):
            i = position * n + sample
            length = int(masks[i].sum())
            record = {"index": row.index, "sample": sample, "prompt": row.prompt_text, "response": str(texts[i]),
                      "prompt_tokens": len(row.prompt_ids), "response_tokens": length}
            record.update({key: value for key, value in row.columns.items() if key not in record and _plain(value)})
            if log_probs is not None:
                chosen = masks[i].bool()
                record["log_probs"] = [float(value) for value in log_probs[i][chosen].tolist()]
            records.append(record)
    return records


def _plain(value: Any) -> bool:
    """Columns that go into the output as they are (scalars, strings, lists, dicts of those)."""
    return isinstance(value, (str, int, float, bool, list, dict)) or value is None
