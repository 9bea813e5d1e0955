"""Writing per-sample records (``rlhfctl generate``'s output, ``rlhfctl eval --samples``): jsonl or parquet, chosen by
the file's suffix."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhfctl.recipe.errors import RecipeError

__all__ = ["RECORD_FORMATS", "record_format", "write_records"]

RECORD_FORMATS = {".jsonl": "jsonl", ".parquet": "parquet"}


def record_format(path: str | Path, option: str = "--output") -> str:
    """``jsonl`` or ``parquet`` by ``path``'s suffix; a clear error for any other, before anything runs."""
    suffix = Path(path).suffix.lower()
    if suffix not in RECORD_FORMATS:
        raise RecipeError(f"{option}: {path} must end in {' or '.join(RECORD_FORMATS)} (the suffix picks the format)",
                          key_path=option, kind="bad_choice")
    return RECORD_FORMATS[suffix]


def write_records(path: str | Path, records: Sequence[dict[str, Any]]) -> Path:
    """Write ``records`` to ``path`` (its parent made), one row each; returns the path."""
    target = Path(path).expanduser()
    kind = record_format(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "jsonl":
        target.write_text("".join(json.dumps(record) + "\n" for record in records))
    else:
        import pyarrow as pa  # only for parquet output
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(list(records)), target)
    return target
