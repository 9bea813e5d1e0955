"""Bundled verifiable rewards: name one in a recipe as ``roles.reward.function: rlhfctl.rewards:gsm8k``.

Each is a batch reward function (see :mod:`rlhfctl.tasks.reward_fn`),
``fn(prompts, responses, **columns)``, whose settings come from ``roles.reward.function_kwargs``:

- :func:`gsm8k`: the final number (``method="strict"``: after ``####``; ``"flexible"``: the last one);
- :func:`math`: the final ``\\boxed{}`` answer, by math-verify when installed (``rlhfctl[math]``),
  else by normalized string match; :func:`math_backend` names the one in use;
- :func:`format`: a regular expression the response must match;
- :func:`dispatch_by_source`: ``gsm8k`` or ``math`` by each sample's ``data_source`` (:data:`SOURCE_REWARDS`);
- :func:`combined`: several named rewards and their weighted sum, one dict per sample;
- :func:`code`: the fraction of the row's tests the response's program passes, run in the python sandbox.

``gsm8k``, ``math`` and ``dispatch_by_source`` score as verl's ``verl/utils/reward_score`` does
(``tests/rewards`` checks them against verl's numbers). Importing this package imports no torch,
transformers or ray. ``docs/rewards.md`` has the details.
"""

from rlhfctl.rewards.code_execution import code
from rlhfctl.rewards.dispatch import SOURCE_REWARDS, dispatch_by_source
from rlhfctl.rewards.errors import RewardSettingError
from rlhfctl.rewards.format_match import format
from rlhfctl.rewards.gsm8k_answers import gsm8k
from rlhfctl.rewards.math_answers import math, math_backend
from rlhfctl.rewards.named_rewards import combined

__all__ = [
    "SOURCE_REWARDS",
    "RewardSettingError",
    "code",
    "combined",
    "dispatch_by_source",
    "format",
    "gsm8k",
    "math",
    "math_backend",
]
