"""Responses to held-out prompts, scored by the reward role: the one path behind training's ``val/*`` metrics,
``rlhfctl eval`` and ``rlhfctl generate``.

A call is keyed by the policy's step and the batch's first prompt (``meta_info["validate_at"]``), so the samples of
a validation depend only on the weights, the seed, the prompts and that key: evaluating a checkpoint of step N with
the run's seed draws exactly what the run's validation at step N drew, sampled or greedy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rlhfctl.protocol import DataProto
from rlhfctl.rollout.batch_join import concat_prompt_padded
from rlhfctl.trainer.metrics import validation_metrics
from rlhfctl.trainer.prompt_source import to_dataproto
from rlhfctl.trainer.sample_metric import sample_metric

__all__ = ["respond", "respond_and_score", "scored_validation_metrics"]


def respond(rows: Sequence[Any], tokenizer: Any, generator: Any, batch_size: int, n: int, step: int,
            do_sample: bool | None = None) -> Iterator[tuple[Sequence[Any], DataProto]]:
    """``(prompt rows, responses)`` per batch of ``batch_size`` prompts: ``n`` responses each, greedy when ``n`` is
    1 (unless ``do_sample`` says otherwise), drawn from the generator's validation stream at ``step``."""
    sample = n > 1 if do_sample is None else bool(do_sample)
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        prompts = to_dataproto(list(chunk), tokenizer)
        prompts.meta_info.update(do_sample=sample, n=n, validate=True, validate_at=(int(step), start))
        yield chunk, generator.generate_sequences(prompts)


def respond_and_score(rows: Sequence[Any], tokenizer: Any, generator: Any, reward: Any, batch_size: int, n: int,
                      step: int, progress: Callable[[int, int], None] | None = None) -> DataProto:
    """Every response to ``rows`` (see :func:`respond`), joined with the reward role's scores, in prompt order;
    ``progress(prompts done, prompts)`` after each batch. Batches whose prompts differ in width join left-padded."""
    scored = []
    for chunk, responses in respond(rows, tokenizer, generator, batch_size, n, step):
        scored.append(responses.union(reward.compute_rewards(responses)))
        if progress is not None:
            progress(min(len(scored) * batch_size, len(rows)), len(rows))
    return concat_prompt_padded(scored, tokenizer.pad_token_id)


def scored_validation_metrics(batch: DataProto, k: int) -> dict[str, float]:
    """The ``val/*`` metrics of a scored batch of ``k`` responses per prompt (see ``validation_metrics``): with
    ``k > 1`` the reward must return an ``acc`` (or ``score``) entry, for ``pass@k``."""
    scores = batch.batch["token_level_scores"].sum(-1).numpy()
    sources = batch.non_tensor_batch.get("data_source")
    if k == 1:
        return validation_metrics(scores, sources)
    return validation_metrics(scores, sources, accuracy=sample_metric(batch, "acc"), groups=batch.non_tensor_batch["uid"], k=k)
