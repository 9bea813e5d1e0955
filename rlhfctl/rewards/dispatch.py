"""Score each sample with the bundled reward its ``data_source`` names, as verl's ``default_compute_score`` routes.

:data:`SOURCE_REWARDS` is the whole routing table. It holds the sources that verl's
``verl/utils/reward_score/__init__.py`` scores with its GSM8K grader or its MATH grader
(``math_reward``; ``math_verify`` is its suggested swap). verl's other sources (``math_dapo``,
``aime*``, ``numina_*``, code and search datasets) use graders not bundled here: they are unknown
sources, an error, as a source verl does not know is there.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from rlhfctl.rewards.batch import check_batch, take_rows
from rlhfctl.rewards.errors import RewardSettingError
from rlhfctl.rewards.gsm8k_answers import gsm8k
from rlhfctl.rewards.math_answers import math

__all__ = ["SOURCE_REWARDS", "dispatch_by_source"]

SOURCE_REWARDS: MappingProxyType[str, Callable[..., list[float]]] = MappingProxyType({
    "openai/gsm8k": gsm8k,
    "lighteval/MATH": math,
    "DigitalLearningGmbH/MATH-lighteval": math,
    "HuggingFaceH4/MATH-500": math,
})


def dispatch_by_source(
    prompts: list[str], responses: list[str], data_source: list[str], ground_truth: list[Any], **columns: Any
) -> list[float]:
    """Each sample's reward from ``SOURCE_REWARDS[data_source]``, called once per source on that source's samples.

    ``columns`` (lists: their rows for those samples) and settings (e.g. ``method``, ``checker``) go to
    every routed reward, which ignores what it does not take. An unknown source raises
    :class:`RewardSettingError` before anything is scored.
    """
    check_batch(prompts, responses, data_source=data_source, ground_truth=ground_truth, **columns)
    unknown = sorted({repr(source) for source in data_source if not isinstance(source, str) or source not in SOURCE_REWARDS})
    if unknown:
        raise RewardSettingError(
            f"dispatch_by_source: no bundled reward for data_source {', '.join(unknown)}; known sources: "
            f"{', '.join(SOURCE_REWARDS)} (score other sources with your own roles.reward.function)"
        )
    rows_by_source: dict[str, list[int]] = {}
    for row, source in enumerate(data_source):
        rows_by_source.setdefault(source, []).append(row)
    scores = [0.0] * len(responses)
    for source, rows in rows_by_source.items():
        routed = SOURCE_REWARDS[source](
            prompts=[prompts[row] for row in rows],
            responses=[responses[row] for row in rows],
            data_source=[source] * len(rows),
            ground_truth=[ground_truth[row] for row in rows],
            **take_rows(columns, rows),
        )
        for row, value in zip(rows, routed):
            scores[row] = value
    return scores
