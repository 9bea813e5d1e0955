"""Prompt data: read files, tokenize and bound prompts, batch them resumably."""

from rlhfctl.data.prompts import *  # noqa: F403 - rlhfctl.data.prompts gathers the names a trainer needs
from rlhfctl.data.prompts import __all__  # noqa: F401
