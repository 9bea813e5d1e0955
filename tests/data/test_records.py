"""load_records on a Hugging Face ``datasets`` directory saved with ``save_to_disk``, read with pyarrow."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from rlhfctl.data.records import load_records
from rlhfctl.data.errors import DataFileError
from rlhfctl.recipe import load_recipe
from rlhfctl.recipe.check_runtime import check_data
from rlhfctl.recipe.resolved import resolve

ROWS = [
    {"prompt": "digits 1 2:", "ground_truth": "12", "data_source": "a", "tags": [1, 2]},
    {"prompt": "digits 3:", "ground_truth": "3", "data_source": "b", "tags": []},
    {"prompt": "digits 4 5 6:", "ground_truth": "456", "data_source": "a", "tags": [7]},
]


def write_saved_dataset(directory, rows, shards: int = 2) -> None:
    """The layout ``Dataset.save_to_disk`` writes: Arrow IPC stream shards listed in state.json, plus dataset_info.json."""
    directory.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    size = -(-len(rows) // shards)
    files = []
    for index in range(shards):
        name = f"data-{index:05d}-of-{shards:05d}.arrow"
        with pa.OSFile(str(directory / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(index * size, size))
        files.append({"filename": name})
    state = {"_data_files": files, "_fingerprint": "0" * 16, "_format_columns": None, "_format_kwargs": {},
             "_format_type": None, "_output_all_columns": False, "_split": None}
    (directory / "state.json").write_text(json.dumps(state, indent=2))
    (directory / "dataset_info.json").write_text(json.dumps({"citation": "", "description": "", "features": {}}))


def test_a_save_to_disk_directory_loads_its_shards_in_order(tmp_path):
    write_saved_dataset(tmp_path / "prompts", ROWS)
    assert load_records(tmp_path / "prompts") == ROWS


def test_a_directory_saved_by_the_datasets_package_loads_the_same_rows(tmp_path):
    datasets = pytest.importorskip("datasets")
    from datasets.table import InMemoryTable

    # Explicit fingerprints: some datasets/pyarrow pairs cannot hash a table to make one.
    dataset = datasets.Dataset(InMemoryTable(pa.Table.from_pylist(ROWS)), fingerprint="1" * 16)
    dataset.save_to_disk(str(tmp_path / "real"), num_shards=2)
    assert load_records(tmp_path / "real") == ROWS
    # A row selection (an indices mapping in memory) is written out as the selected rows.
    dataset.select([2, 0], new_fingerprint="2" * 16).save_to_disk(str(tmp_path / "selected"))
    assert load_records(tmp_path / "selected") == [ROWS[2], ROWS[0]]


def test_a_saved_dataset_dict_asks_for_one_split(tmp_path):
    write_saved_dataset(tmp_path / "dd" / "train", ROWS)
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    with pytest.raises(DataFileError, match=r"DatasetDict with splits \['train'\]; give one split's directory"):
        load_records(tmp_path / "dd")
    assert load_records(tmp_path / "dd" / "train") == ROWS


@pytest.mark.parametrize("breakage,match", [
    ("no_state", "is a directory without state.json"),
    ("missing_shard", "listed in state.json but missing"),
    ("bad_shard", "not a readable Arrow IPC file"),
    ("bad_state", "not a datasets state file"),
    ("empty", "holds no records"),
])
def test_a_broken_saved_dataset_names_the_file_and_the_cause(tmp_path, breakage, match):
    directory = tmp_path / "broken"
    write_saved_dataset(directory, [] if breakage == "empty" else ROWS, shards=1 if breakage == "empty" else 2)
    if breakage == "no_state":
        (directory / "state.json").unlink()
    elif breakage == "missing_shard":
        (directory / "data-00001-of-00002.arrow").unlink()
    elif breakage == "bad_shard":
        (directory / "data-00001-of-00002.arrow").write_bytes(b"not arrow at all")
    elif breakage == "bad_state":
        (directory / "state.json").write_text("{}")
    with pytest.raises(DataFileError, match=match):
        load_records(directory)


def test_validate_accepts_a_saved_dataset_directory_and_rejects_a_plain_one(tmp_path):
    write_saved_dataset(tmp_path / "saved", ROWS)
    (tmp_path / "plain").mkdir()
    cfg = load_recipe("recipes/quickstart.yaml", [f"data.train_files=[{tmp_path / 'saved'}]",
                                                  f"data.val_files=[{tmp_path / 'plain'}]"])
    messages = [issue.message for issue in check_data(resolve(cfg)) if issue.severity == "error"]
    assert messages == [f"data.val_files[0]: {tmp_path / 'plain'} is a directory without state.json; give a data "
                        "file or a directory written by datasets' save_to_disk"]
