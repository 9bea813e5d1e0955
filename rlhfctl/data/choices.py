"""What a recipe may say about its prompts (``data.overlong``): the one home of the names, without torch,
so the schema checks read them before a command's heavy imports."""

from __future__ import annotations

__all__ = ["OVERLONG_POLICIES"]

#: What happens to a prompt longer than ``data.max_prompt_length``: see ``rlhfctl.data.prompts.PromptDataset``.
OVERLONG_POLICIES: tuple[str, ...] = ("error", "truncate", "skip")
