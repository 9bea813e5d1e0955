"""Read a data file into a list of plain dict records, whatever its format.

Supported: ``.jsonl`` (one JSON object per line; blank lines are skipped), ``.json`` (JSON lines,
or a single JSON array of objects), ``.parquet`` (needs ``pyarrow``) and ``.csv`` (header row,
all values as strings). Every problem raises :class:`DataFileError` naming the file and, where
there is one, the 1-based line number.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
from pathlib import Path
from typing import Any

from rlhfctl.data.errors import DataFileError

__all__ = ["SUPPORTED_EXTENSIONS", "load_records"]

SUPPORTED_EXTENSIONS = (".jsonl", ".json", ".parquet", ".csv")


def load_records(path: str | os.PathLike[str], limit: int | None = None) -> list[dict[str, Any]]:
    """Load every record of a prompt file (or the first ``limit``: validate's sample); fail with the file and line.

    With ``limit``, JSON lines and CSV files are read only as far as the first ``limit`` lines; a JSON
    array is parsed whole and parquet is read one batch.
    """
    file = Path(os.path.expanduser(str(path)))
    if not file.exists():
        raise DataFileError(f"{file}: no such file; check data paths in the recipe (relative to {os.getcwd()})")
    if file.is_dir():
        raise DataFileError(f"{file}: is a directory; give the path of a data file")
    suffix = file.suffix.lower()
    if suffix not in SUPPORTED_EXTENSIONS:
        raise DataFileError(
            f"{file}: unsupported file type {suffix or '(no extension)'!r}; "
            f"use one of {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    if file.stat().st_size == 0:
        raise DataFileError(f"{file}: the file is empty; it must hold at least one record")
    if suffix == ".parquet":
        records = _read_parquet(file, limit)
    else:
        header = 1 if suffix == ".csv" else 0
        text = _decode(file, _head(file, None if limit is None else limit + header))
        if suffix == ".json" and limit is not None and text.lstrip().startswith("["):
            text = _decode(file, _head(file, None))  # an array parses only whole
        if suffix == ".csv":
            records = _read_csv(file, text)
        elif suffix == ".json" and text.lstrip().startswith("["):
            records = _read_json_array(file, text)
        else:
            records = _read_json_lines(file, text)
    if not records:
        raise DataFileError(f"{file}: the file holds no records; it must hold at least one")
    return records if limit is None else records[:limit]


def _head(file: Path, lines: int | None) -> bytes:
    """The file's bytes, or only its first ``lines`` lines."""
    if lines is None:
        return file.read_bytes()
    with file.open("rb") as handle:
        return b"".join(itertools.islice(handle, lines))


def _decode(file: Path, data: bytes) -> str:
    """Decode UTF-8 (a leading BOM is allowed), reporting the line of the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        offset = error.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data[:offset].count(b"\n") + 1
        raise DataFileError(
            f"{file}: line {line}: not valid UTF-8 (byte {data[offset:offset + 1]!r}); "
            "re-save the file as UTF-8"
        ) from error


def _read_json_lines(file: Path, text: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    # Split on "\n" only: str.splitlines() would also split on U+2028 etc., valid inside JSON strings.
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFileError(f"{file}: line {number}: malformed JSON ({error.msg}, column {error.colno})") from error
        if not isinstance(value, dict):
            raise DataFileError(
                f"{file}: line {number}: expected a JSON object such as {{\"prompt\": ...}}, "
                f"got a JSON {type(value).__name__}"
            )
        records.append(value)
    return records


def _read_json_array(file: Path, text: str) -> list[dict[str, Any]]:
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataFileError(
            f"{file}: line {error.lineno}: malformed JSON ({error.msg}, column {error.colno})"
        ) from error
    for number, value in enumerate(values, start=1):
        if not isinstance(value, dict):
            raise DataFileError(
                f"{file}: array element {number}: expected a JSON object, got a JSON {type(value).__name__}"
            )
    return list(values)


def _read_csv(file: Path, text: str) -> list[dict[str, Any]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        records = [dict(row) for row in reader]
    except csv.Error as error:
        raise DataFileError(f"{file}: line {reader.line_num}: malformed CSV ({error})") from error
    if reader.fieldnames is None:
        raise DataFileError(f"{file}: no header row; the first line must name the columns")
    for number, row in enumerate(records, start=1):
        if None in row:
            raise DataFileError(
                f"{file}: data row {number}: more fields than the {len(reader.fieldnames)} header columns"
            )
    return records


def _read_parquet(file: Path, limit: int | None) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as parquet
    except ImportError as error:
        raise DataFileError(f"{file}: reading .parquet files needs pyarrow; run `pip install pyarrow`") from error
    try:
        if limit is None:
            return parquet.read_table(file).to_pylist()
        batch = next(parquet.ParquetFile(file).iter_batches(batch_size=limit), None)
        return [] if batch is None else batch.to_pylist()
    except Exception as error:  # pyarrow raises ArrowInvalid/OSError subclasses for bad files
        raise DataFileError(f"{file}: not a readable parquet file ({error})") from error
