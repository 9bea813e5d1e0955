"""Tokenizers and models built from a recipe's ``model`` section (hub/local path or inline config)."""

from rlhfctl.models import loading
from rlhfctl.models.loading import *  # noqa: F403 - the package exports what the loading module declares
from rlhfctl.models.tokenizer import CharTokenizer

__all__ = [*loading.__all__, "CharTokenizer"]
