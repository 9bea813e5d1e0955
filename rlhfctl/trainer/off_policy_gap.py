"""A warning, once a run, when the trained tokens were sampled far from the actor's policy (``rollout/logprob_diff``).

``rollout/logprob_diff`` is the mean |actor log-prob - behaviour log-prob| per trained token. The off-policy corrections
(``rollout.importance_cap``, ``rollout.importance_mask``, decoupled PPO) cap or mask each token's ratio; none brings a
token sampled far from the current policy back on-policy. On the 33M ``repeat`` benchmark with partial rollouts
(docs/performance.md), carried tokens one version old read 0.02-0.03 nats at lr 1e-4, where partial rollouts matched
the synchronous step's reward, and 0.14-0.40 at lr 1e-3, where the policy drifted into answers that never end.
:data:`FAR_NATS` sits between: a heuristic, said as one.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["FAR_NATS", "OffPolicyGapWatch", "far_off_policy"]

FAR_NATS = 0.1
"""A mean gap per token above this is worth a warning: well past a bf16 rollout's (about 1e-3), well short of 0.14."""

GAP = "rollout/logprob_diff"
AGES = ("rollout/partial/staleness/mean", "rollout/staleness/mean")  # partial rollouts', else a rollout group's


def far_off_policy(step: int, metrics: Mapping[str, float], threshold: float = FAR_NATS) -> str | None:
    """The warning for a step whose trained tokens are far off-policy, with what to change; None when they are not."""
    gap = metrics.get(GAP)
    if gap is None or not gap > threshold:
        return None
    age = next((float(metrics[key]) for key in AGES if key in metrics), 0.0)
    head = (f"step {step}: {GAP} is {gap:.3g} nats per token (above {threshold:g}): the trained tokens were sampled by "
            f"a policy far from the actor's")
    if age > 0:
        return (f"{head}, {age:.2f} versions old on average. The off-policy correction caps or masks ratios; it does not "
                "bring such tokens back on-policy. Lower roles.actor.optim.lr (one update moves the policy this far) "
                "or trainer.max_staleness (see docs/rollout.md).")
    return (f"{head} though they are of its own version: the engine samples another model than the actor's. Check "
            "rollout.dtype and the weight sync (rollout/sync_check_diff).")


class OffPolicyGapWatch:
    """:func:`far_off_policy` once a run: the first step past the threshold is reported, later ones are not."""

    def __init__(self, threshold: float = FAR_NATS) -> None:
        self.threshold, self.warned = threshold, False

    def check(self, step: int, metrics: Mapping[str, float]) -> str | None:
        """The warning for this step if it is the run's first far-off-policy step, else None."""
        if self.warned:
            return None
        text = far_off_policy(step, metrics, self.threshold)
        self.warned = text is not None
        return text
