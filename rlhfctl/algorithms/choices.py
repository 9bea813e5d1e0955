"""The names a recipe may give for the loss aggregation and the KL penalty: their one home.

No torch here, so the recipe's schema checks read them before a command's heavy imports.
``rlhfctl.algorithms.losses`` and ``rlhfctl.algorithms.kl`` implement exactly these.
"""

from __future__ import annotations

__all__ = ["KL_KINDS", "LOSS_AGG_MODES"]

#: How a loss over masked tokens is reduced (``roles.actor.loss_agg_mode``): see ``losses.agg_loss``.
LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

#: The KL estimators (``algorithm.kl.*_kind``): see ``kl.kl_penalty``.
KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3", "abs")
