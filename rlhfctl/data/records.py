"""Read a data file into a list of plain dict records, whatever its format.

Supported: ``.jsonl`` (one JSON object per line; blank lines are skipped), ``.json`` (JSON lines,
or a single JSON array of objects), ``.parquet`` (needs ``pyarrow``) and ``.csv`` (header row,
all values as strings), and a directory written by Hugging Face ``datasets``' ``Dataset.save_to_disk``
(``state.json`` + ``data-*.arrow``, read with pyarrow: the ``datasets`` package is not needed). Every
problem raises :class:`DataFileError` naming the file and, where
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

__all__ = ["SUPPORTED_EXTENSIONS", "count_records", "load_records"]

SUPPORTED_EXTENSIONS = (".jsonl", ".json", ".parquet", ".csv")
SAVED_DATASET_STATE = "state.json"  # what marks a directory written by datasets' save_to_disk


def load_records(path: str | os.PathLike[str], limit: int | None = None) -> list[dict[str, Any]]:
    """Load every record of a prompt file (or the first ``limit``: validate's sample); fail with the file and line.

    With ``limit``, JSON lines and CSV files are read only as far as the first ``limit`` lines; a JSON
    array is parsed whole and parquet is read one batch.
    """
    file = Path(os.path.expanduser(str(path)))
    if not file.exists():
        raise DataFileError(f"{file}: no such file; check data paths in the recipe (relative to {os.getcwd()})")
    if file.is_dir():
        return _nonempty(file, _read_saved_dataset(file), limit)
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
    return _nonempty(file, records, limit)


def count_records(path: str | os.PathLike[str]) -> int | None:
    """The records of a data file without reading them: parquet's metadata, the non-blank lines of JSON lines,
    the rows of a CSV (a JSON array is parsed); None for a directory or a file that cannot be read."""
    file = Path(os.path.expanduser(str(path)))
    suffix = file.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as parquet  # pyarrow: only for a Parquet file, off the CLI's fast path

            return int(parquet.ParquetFile(file).metadata.num_rows)
        if suffix == ".csv":
            with file.open(encoding="utf-8-sig", newline="") as handle:
                return max(sum(1 for _ in csv.reader(handle)) - 1, 0)
        if suffix in (".jsonl", ".json"):
            with file.open("rb") as handle:
                first = handle.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
                if suffix == ".json" and first.startswith(b"["):
                    return len(json.loads(file.read_bytes().decode("utf-8-sig")))
                handle.seek(0)
                return sum(1 for line in handle if line.strip())
    except Exception:  # noqa: BLE001 - the count is informative; load_records reports a bad file
        return None
    return None


def _nonempty(file: Path, records: list[dict[str, Any]], limit: int | None) -> list[dict[str, Any]]:
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
        import pyarrow.parquet as parquet  # pyarrow: only for a Parquet file, and may be missing
    except ImportError as error:
        raise DataFileError(f"{file}: reading .parquet files needs pyarrow; run `pip install pyarrow`") from error
    try:
        if limit is None:
            return parquet.read_table(file).to_pylist()
        batch = next(parquet.ParquetFile(file).iter_batches(batch_size=limit), None)
        return [] if batch is None else batch.to_pylist()
    except Exception as error:  # pyarrow raises ArrowInvalid/OSError subclasses for bad files
        raise DataFileError(f"{file}: not a readable parquet file ({error})") from error


def _read_saved_dataset(directory: Path) -> list[dict[str, Any]]:
    """Rows of a ``Dataset.save_to_disk`` directory: the Arrow IPC stream files listed in state.json."""
    splits = directory / "dataset_dict.json"
    if splits.is_file():
        names = json.loads(splits.read_text(encoding="utf-8")).get("splits", [])
        raise DataFileError(
            f"{directory}: a saved DatasetDict with splits {names}; give one split's directory, "
            f"e.g. {directory / (names[0] if names else 'train')}"
        )
    state_file = directory / SAVED_DATASET_STATE
    if not state_file.is_file():
        raise DataFileError(
            f"{directory}: is a directory without {SAVED_DATASET_STATE}; give the path of a data file "
            f"({', '.join(SUPPORTED_EXTENSIONS)}) or a directory written by datasets' save_to_disk"
        )
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        shards = [entry["filename"] for entry in state["_data_files"]]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise DataFileError(f"{state_file}: not a datasets state file (no _data_files list: {error})") from error
    if state.get("_indices_data_files"):
        raise DataFileError(
            f"{directory}: saved with an indices mapping (an old datasets version); re-save it with a "
            "current `datasets` (save_to_disk writes the selected rows) or as .parquet"
        )
    records: list[dict[str, Any]] = []
    for name in shards:
        records.extend(_read_arrow_shard(directory / name))
    return records


def _read_arrow_shard(shard: Path) -> list[dict[str, Any]]:
    """One ``data-*.arrow`` file: an Arrow IPC stream (what datasets writes), or the IPC file format."""
    import pyarrow as pa  # pyarrow: only for an Arrow shard, off the CLI's fast path

    if not shard.is_file():
        raise DataFileError(f"{shard}: listed in {SAVED_DATASET_STATE} but missing")
    for open_reader in (pa.ipc.open_stream, pa.ipc.open_file):
        try:
            with pa.memory_map(str(shard), "r") as source:
                return open_reader(source).read_all().to_pylist()
        except pa.ArrowInvalid:
            continue
    raise DataFileError(f"{shard}: not a readable Arrow IPC file")
