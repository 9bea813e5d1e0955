"""The one error a bundled reward raises: it was set up wrongly (never: the model wrote something odd)."""

from __future__ import annotations

from rlhfctl.errors import UserError

__all__ = ["RewardSettingError"]


class RewardSettingError(UserError, ValueError):
    """A bundled reward got a setting it cannot use: a bad pattern, an unknown data source, a bad spec.

    A ``ValueError`` too, so callers that catch bad values keep working; a ``UserError``, so the CLI
    shows it on one line and exits 2.
    """
