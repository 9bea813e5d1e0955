"""The bundled "repeat" task: answers from one token to the whole budget, lengths drawn from a heavy tail.

It exists to measure partial rollouts: most responses end within a few tokens, a few run to the budget, so a
step that waits for its longest response waits for the tail. A prompt ``"repeat 38172:"`` asks for its digits
again, ``"38172"``, then EOS; with the character tokenizer every digit is one token, so the answer's length in
tokens is its digit count. The count is a discretized Pareto (Zipf-like) draw clipped to ``[1, max_len]``::

    P(length >= k) = k ** -alpha   for 1 <= k < max_len, and the rest of the mass at max_len

(``floor(U ** (-1 / alpha))`` for ``U`` uniform in (0, 1]). The defaults, ``max_len`` 64 and ``alpha`` 1.2,
give a median of 1-2 digits, a 99th percentile near 46 and 0.7% of answers at the cap. A recipe picks both in
the task name: ``data.task: repeat?max_len=255&alpha=1.0`` (:mod:`rlhfctl.tasks.task_query` reads the query,
:func:`settings_of` checks it). For answers that reach the whole budget with their EOS, set
``max_len = rollout.max_new_tokens - 1``; ``data.max_prompt_length`` must hold ``len("repeat :") + max_len``
characters, 72 for the defaults.

:func:`score` gives partial credit, ``max(0, matching prefix - overshoot) / target length``: 1.0 only for the
exact answer. The reward reads decoded text (no EOS), and generation stops only at EOS or the budget, so a
response equal to the answer and shorter than the budget ended with EOS; one that goes on past the answer
(it did not end) loses a character of credit per extra character.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlhfctl.tasks.reward_fn import check_reward_inputs
from rlhfctl.tasks.task import Task, UnknownTaskError

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_MAX_LEN",
    "NAME",
    "PROMPT_PREFIX",
    "RepeatSettings",
    "length_quantiles",
    "make_demonstrations",
    "make_prompts",
    "score",
    "settings_of",
    "target_lengths",
    "task",
]

NAME = "repeat"
PROMPT_PREFIX = "repeat "
"""A prompt is this, the digits, then ``:``."""

DEFAULT_MAX_LEN = 64
"""The longest answer (in digits, so in character tokens) when the task name sets no ``max_len``."""
DEFAULT_ALPHA = 1.2
"""The tail's exponent when the task name sets no ``alpha``: smaller is heavier (more long answers)."""


@dataclass(frozen=True)
class RepeatSettings:
    """The task's settings: the cap on an answer's length and the tail exponent of the lengths."""

    max_len: int = DEFAULT_MAX_LEN
    alpha: float = DEFAULT_ALPHA


def _problem(key: str, value: Any) -> str | None:
    if isinstance(value, bool):
        return f"{key} must be a number, got {value!r}"
    if key == "max_len" and not (isinstance(value, int) and value >= 1):
        return f"max_len must be a whole number of digits >= 1, got {value!r}"
    if key == "alpha" and not (isinstance(value, (int, float)) and 0 < value < math.inf):
        return f"alpha must be a positive number (the tail exponent, e.g. 1.2), got {value!r}"
    return None


def settings_of(name: str, query: Mapping[str, Any]) -> RepeatSettings:
    """The settings a task name's query gives (defaults for the keys it leaves out); UnknownTaskError naming the
    first unknown key or bad value."""
    known = [field for field in RepeatSettings.__dataclass_fields__]
    for key, value in query.items():
        if key not in known:
            raise UnknownTaskError(f"{name!r}: the {NAME} task has no setting {key!r}; its settings: {', '.join(known)}")
        problem = _problem(key, value)
        if problem is not None:
            raise UnknownTaskError(f"{name!r}: {problem}")
    return RepeatSettings(**query)


def task(name: str, query: Mapping[str, Any]) -> Task:
    """The task a name like ``repeat?max_len=8`` names: prompts, demonstrations and :func:`score`."""
    settings = settings_of(name, query)
    return Task(
        name,
        functools.partial(make_prompts, settings),
        score,
        f"reward = matching prefix - overshoot, over the answer's length; answers of 1..{settings.max_len} digits, "
        f"a Pareto tail (alpha {settings.alpha:g}); demonstrations answer exactly",
        functools.partial(make_demonstrations, settings),
    )


def _length(rng: random.Random, settings: RepeatSettings) -> int:
    uniform = 1.0 - rng.random()  # in (0, 1]
    return min(settings.max_len, int(uniform ** (-1.0 / settings.alpha)))


def make_prompts(settings: RepeatSettings, num: int, seed: int) -> list[dict[str, str]]:
    """``num`` records ``{"prompt": "repeat 38172:", "ground_truth": "38172"}``, the same for a seed."""
    if num < 0:
        raise ValueError(f"num must be a non-negative number of prompts, got {num}")
    rng = random.Random(seed)
    records = []
    for _ in range(num):
        digits = "".join(str(rng.randrange(10)) for _ in range(_length(rng, settings)))
        records.append({"prompt": f"{PROMPT_PREFIX}{digits}:", "ground_truth": digits})
    return records


def make_demonstrations(settings: RepeatSettings, num: int, seed: int) -> list[dict[str, str]]:
    """``num`` sft records whose ``response`` is the exact answer (what :func:`score` gives 1.0)."""
    return [{**record, "response": record["ground_truth"]} for record in make_prompts(settings, num, seed)]


def target_lengths(settings: RepeatSettings, num: int, seed: int) -> list[int]:
    """The answers' lengths of the first ``num`` prompts for ``seed``: the distribution a run draws from."""
    return [len(record["ground_truth"]) for record in make_prompts(settings, num, seed)]


def length_quantiles(
    settings: RepeatSettings, num: int, seed: int, quantiles: Sequence[float] = (0.5, 0.9, 0.99, 1.0)
) -> dict[float, int]:
    """Nearest-rank quantiles of :func:`target_lengths` (``{0.5: median, ...}``), to show how heavy the tail is."""
    lengths = sorted(target_lengths(settings, num, seed))
    if not lengths:
        raise ValueError("length_quantiles needs at least one prompt (num >= 1)")
    for q in quantiles:
        if not 0 < q <= 1:
            raise ValueError(f"a quantile is in (0, 1], got {q}")
    return {q: lengths[max(1, math.ceil(q * len(lengths))) - 1] for q in quantiles}


def _credit(response: str, target: str) -> float:
    if not target:
        return 1.0 if not response else 0.0
    prefix = next((i for i, (a, b) in enumerate(zip(response, target)) if a != b), min(len(response), len(target)))
    overshoot = max(0, len(response) - len(target))
    return max(0, prefix - overshoot) / len(target)


def score(prompts: list[str], responses: list[str], ground_truth: list[Any], **columns: Any) -> list[float]:
    """Per sample ``max(0, matching prefix - overshoot) / len(answer)``: 1.0 only for the exact answer, 0 for an
    empty response (an empty answer, which the task never makes, scores 1.0 only for an empty response)."""
    check_reward_inputs(prompts, responses, ground_truth=ground_truth, **columns)
    return [_credit(response, "" if truth is None else str(truth)) for response, truth in zip(responses, ground_truth)]
