"""Prompt data: read files, tokenize and bound prompts, batch them resumably.

The names are imported on first use, so that the light modules (``records``: file formats and reading)
load without torch, for the checks that run before a command's heavy imports.
"""

from __future__ import annotations

from rlhfctl.lazy_exports import lazy_exports

__all__ = [
    "OVERLONG_POLICIES",
    "SUPPORTED_EXTENSIONS",
    "DataConfigError",
    "DataFileError",
    "PromptBatch",
    "PromptBatcher",
    "PromptDataset",
    "PromptRow",
    "collate_prompts",
    "load_records",
    "prompt_of",
]

__getattr__ = lazy_exports(__name__, {name: "rlhfctl.data.prompts" for name in __all__})
