"""verl-format gsm8k-style rows (as verl's examples/data_preprocess/gsm8k.py writes them), for the tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."


def gsm8k_rows(count: int = 4, split: str = "train") -> list[dict[str, Any]]:
    """``count`` rows in verl's layout: chat prompt, ground truth under reward_model, extra_info per row."""
    rows = []
    for index in range(count):
        question = f"Tom has {index} apples and buys {index + 2} more. How many apples does he have?"
        answer = str(2 * index + 2)
        rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "answer": f"... #### {answer}", "question": question},
        })
    return rows


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    """The rows as a parquet file (pyarrow infers the struct and list columns)."""
    import pyarrow as pa
    from pyarrow import parquet

    parquet.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """The rows as JSON lines."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path
