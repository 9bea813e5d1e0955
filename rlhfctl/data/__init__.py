"""Prompt data: read files, tokenize and bound prompts, batch them resumably."""

from rlhfctl.data.batching import PromptBatcher
from rlhfctl.data.errors import DataConfigError, DataFileError
from rlhfctl.data.prompts import PromptBatch, PromptDataset, PromptRow, collate_prompts
from rlhfctl.data.records import SUPPORTED_EXTENSIONS, load_records

__all__ = [
    "SUPPORTED_EXTENSIONS",
    "DataConfigError",
    "DataFileError",
    "PromptBatch",
    "PromptBatcher",
    "PromptDataset",
    "PromptRow",
    "collate_prompts",
    "load_records",
]
