"""PipelineError: a pipeline file, reference or override that cannot be used."""

from __future__ import annotations

from rlhfctl.recipe.errors import RecipeError

__all__ = ["PipelineError"]


class PipelineError(RecipeError):
    """A problem with a pipeline file (a RecipeError, so the CLI reports it as a user error, exit 2).

    ``key_path`` names where, e.g. ``stages.ppo.overrides[1]``.
    """
