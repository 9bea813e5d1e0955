"""DataProto: construction, row/column operations, padding, pickling and the Ray object store."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhfctl.protocol import DataProto


def make(rows: int = 5, meta: dict | None = None) -> DataProto:
    """Rows whose values encode their index, so order and identity are easy to check."""
    return DataProto.from_dict(
        tensors={
            "x": torch.arange(rows, dtype=torch.float32),
            "ids": torch.arange(rows * 3, dtype=torch.int64).reshape(rows, 3),
        },
        non_tensors={
            "tag": [f"row{i}" for i in range(rows)],
            "nested": [[i] * (i % 3) for i in range(rows)],
            "info": [{"i": i, "even": i % 2 == 0} for i in range(rows)],
        },
        meta_info=dict(meta if meta is not None else {"step": 1}),
    )


def rows_of(dp: DataProto) -> list[int]:
    return [int(v) for v in dp.batch["x"].tolist()]


def snapshot(dp: DataProto) -> DataProto:
    """A deep copy to compare against after an operation that must not mutate its input."""
    return pickle.loads(pickle.dumps(dp)).to("cpu")


def assert_row_aligned(dp: DataProto) -> None:
    """Every column of a DataProto built by ``make`` still describes the same original rows."""
    for pos, i in enumerate(rows_of(dp)):
        assert dp.batch["ids"][pos].tolist() == [3 * i, 3 * i + 1, 3 * i + 2]
        assert dp.non_tensor_batch["tag"][pos] == f"row{i}"
        assert dp.non_tensor_batch["nested"][pos] == [i] * (i % 3)
        assert dp.non_tensor_batch["info"][pos] == {"i": i, "even": i % 2 == 0}


# ---------------------------------------------------------------------------------- construction
def test_from_dict_keeps_tensors_and_converts_lists_to_numpy():
    ids = torch.arange(6).reshape(3, 2)
    scores = np.array([0.5, 1.5, 2.5])
    dp = DataProto.from_dict(
        tensors={"ids": ids},
        non_tensors={"scores": scores, "ints": [1, 2, 3], "words": ["a", "bb", "ccc"]},
        meta_info={"temperature": 0.7},
    )
    assert dp.batch["ids"] is ids
    assert dp.non_tensor_batch["scores"] is scores
    assert isinstance(dp.non_tensor_batch["ints"], np.ndarray) and dp.non_tensor_batch["ints"].tolist() == [1, 2, 3]
    assert dp.non_tensor_batch["ints"].dtype.kind == "i"
    assert dp.non_tensor_batch["words"].tolist() == ["a", "bb", "ccc"]
    assert dp.meta_info == {"temperature": 0.7}
    assert len(dp) == 3
    assert dp.keys() == ["ids", "scores", "ints", "words"]


@pytest.mark.parametrize(
    "values",
    [
        [[1, 2], [3]],  # ragged nested lists
        [[1, 2], [3, 4]],  # rectangular nested lists stay one object per row, not a 2-D array
        [{"a": 1}, {"b": [2, 3]}],  # dicts
        [(1, 2), (3, 4)],  # tuples
        [None, 1],
        [[], [[1]]],
    ],
)
def test_from_dict_lists_of_lists_and_dicts_become_one_object_per_row(values):
    dp = DataProto.from_dict(non_tensors={"v": values})
    column = dp.non_tensor_batch["v"]
    assert column.dtype == object
    assert column.shape == (len(values),)
    assert list(column) == values
    assert len(dp) == len(values)


def test_from_dict_empty_list_gives_an_empty_column():
    dp = DataProto.from_dict(non_tensors={"v": []})
    assert dp.non_tensor_batch["v"].shape == (0,)
    assert len(dp) == 0


def test_from_dict_rejects_non_tensor_values_of_the_wrong_type():
    with pytest.raises(TypeError, match="'x' must be a torch.Tensor"):
        DataProto.from_dict(tensors={"x": np.arange(3)})
    with pytest.raises(TypeError, match="numpy arrays or lists"):
        DataProto.from_dict(non_tensors={"x": "abc"})


def test_mismatched_batch_sizes_raise_naming_every_key():
    with pytest.raises(ValueError) as caught:
        DataProto.from_dict(tensors={"ids": torch.zeros(4, 2)}, non_tensors={"tag": ["a", "b", "c"]})
    message = str(caught.value)
    assert "ids=4" in message and "tag=3" in message
    with pytest.raises(ValueError, match="a=2.*b=3"):
        DataProto.from_dict(tensors={"a": torch.zeros(2), "b": torch.zeros(3)})


def test_scalars_are_refused_as_columns():
    with pytest.raises(ValueError, match="'x' is a scalar"):
        DataProto.from_dict(tensors={"x": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="meta_info"):
        DataProto(non_tensor_batch={"y": np.array(3)})


def test_len_of_empty_and_meta_only():
    assert len(DataProto()) == 0
    assert len(DataProto(meta_info={"a": 1})) == 0
    assert len(DataProto.from_dict(non_tensors={"t": ["a", "b"]})) == 2


# ---------------------------------------------------------------------------------- indexing
@pytest.mark.parametrize(
    "index,expected",
    [
        (0, [0]),
        (3, [3]),
        (-1, [4]),
        (-2, [3]),
        (-5, [0]),
        (slice(1, 3), [1, 2]),
        (slice(None, None, 2), [0, 2, 4]),
        (slice(3, None), [3, 4]),
        (slice(-2, None), [3, 4]),
        (slice(4, 2), []),
        ([4, 0, 2], [4, 0, 2]),
        ([1, 1], [1, 1]),
        ([-1], [4]),
        ([], []),
        (np.array([2, 3]), [2, 3]),
        (torch.tensor([0, 4]), [0, 4]),
        (np.array([True, False, True, False, True]), [0, 2, 4]),
        (torch.tensor([False, True, False, False, True]), [1, 4]),
        ([False] * 5, []),
    ],
)
def test_indexing_returns_a_dataproto_of_the_selected_rows(index, expected):
    dp = make(5, meta={"k": "v"})
    before = snapshot(dp)
    out = dp[index]
    assert isinstance(out, DataProto)
    assert rows_of(out) == expected
    assert len(out) == len(expected)
    assert_row_aligned(out)
    assert out.meta_info == {"k": "v"}
    assert dp.equals(before)


@pytest.mark.parametrize("index", [5, -6, 100])
def test_int_index_out_of_range_raises_index_error(index):
    with pytest.raises(IndexError, match="out of range for a DataProto of 5 rows"):
        make(5)[index]


def test_string_index_points_to_the_column_dicts():
    with pytest.raises(TypeError, match=r"\.batch\['x'\]"):
        make(3)["x"]


def test_indexed_meta_info_is_a_copy():
    dp = make(3, meta={"a": 1})
    out = dp[[0, 1]]
    out.meta_info["a"] = 2
    assert dp.meta_info == {"a": 1}


# ---------------------------------------------------------------------------------- columns
def test_select_keeps_only_named_columns_and_none_keeps_all():
    dp = make(4, meta={"a": 1, "b": 2})
    out = dp.select(batch_keys=["x"], non_tensor_batch_keys=["tag"], meta_info_keys=["b"])
    assert list(out.batch) == ["x"] and list(out.non_tensor_batch) == ["tag"] and out.meta_info == {"b": 2}
    everything = dp.select()
    assert everything.equals(dp)
    assert everything.batch is not dp.batch
    nothing = dp.select([], [], [])
    assert nothing.keys() == [] and nothing.meta_info == {}
    assert set(dp.keys()) == {"x", "ids", "tag", "nested", "info"}  # unchanged


def test_select_of_a_missing_key_names_it():
    with pytest.raises(KeyError, match="missing_col"):
        make(2).select(batch_keys=["missing_col"])


def test_pop_removes_and_returns_the_named_columns():
    dp = make(4, meta={"a": 1, "b": 2})
    popped = dp.pop(batch_keys=["ids"], non_tensor_batch_keys=["info"], meta_info_keys=["a"])
    assert list(popped.batch) == ["ids"] and list(popped.non_tensor_batch) == ["info"] and popped.meta_info == {"a": 1}
    assert list(dp.batch) == ["x"] and list(dp.non_tensor_batch) == ["tag", "nested"] and dp.meta_info == {"b": 2}
    assert popped.batch["ids"].shape == (4, 3)
    with pytest.raises(KeyError):
        dp.pop(batch_keys=["ids"])


def test_union_joins_columns_and_accepts_equal_shared_ones():
    dp = make(3, meta={"a": 1})
    left = dp.select(["x", "ids"], ["tag"], ["a"])
    right = DataProto.from_dict(
        tensors={"x": dp.batch["x"].clone(), "score": torch.ones(3)}, non_tensors={"more": [1, 2, 3]}, meta_info={"b": 2}
    )
    out = left.union(right)
    assert set(out.batch) == {"x", "ids", "score"} and set(out.non_tensor_batch) == {"tag", "more"}
    assert out.meta_info == {"a": 1, "b": 2}
    assert set(left.batch) == {"x", "ids"} and left.meta_info == {"a": 1}  # inputs untouched
    # A DataProto with only meta_info unions with any length.
    assert len(out.union(DataProto(meta_info={"c": 3}))) == 3


@pytest.mark.parametrize(
    "other,match",
    [
        (DataProto.from_dict(tensors={"x": torch.tensor([9.0, 1.0, 2.0])}), "tensor 'x' differs"),
        (DataProto.from_dict(non_tensors={"tag": ["row0", "row1", "other"]}), "non-tensor 'tag' differs"),
        (DataProto(meta_info={"a": 2}), "meta_info 'a' differs"),
        (DataProto.from_dict(tensors={"y": torch.zeros(4)}), "3 and 4 rows"),
    ],
)
def test_union_conflicts_raise(other, match):
    with pytest.raises(ValueError, match=match):
        make(3, meta={"a": 1}).union(other)


def _object_column(*rows) -> np.ndarray:
    column = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        column[i] = row
    return column


def test_union_accepts_equal_object_columns_whose_rows_are_numpy_arrays():
    left = DataProto(non_tensor_batch={"a": _object_column(np.array([1, 2]), np.array([3.0, np.nan]))})
    right = DataProto(non_tensor_batch={"a": _object_column(np.array([1, 2]), np.array([3.0, np.nan])),
                                        "b": np.array([1, 2])})
    out = left.union(right)
    assert set(out.non_tensor_batch) == {"a", "b"} and out.equals(out.select())


def test_union_counts_nan_in_the_same_place_as_equal():
    def columns():
        return {"b": np.array([1.0, np.nan, 3.0]),
                "c": _object_column({"x": float("nan")}, [1.0, float("nan")], np.array([np.nan, 2.0]))}

    out = DataProto(non_tensor_batch=columns()).union(DataProto(non_tensor_batch=columns()))
    assert len(out) == 3 and np.isnan(out.non_tensor_batch["b"][1])


@pytest.mark.parametrize(
    "left,right",
    [
        (np.array([1.0, np.nan, 3.0]), np.array([1.0, 2.0, 3.0])),  # NaN against a number
        (np.array([1.0, np.nan, 3.0]), np.array([np.nan, 2.0, 3.0])),  # NaN in another place
        (_object_column(np.array([1, 2]), np.array([3, 4])), _object_column(np.array([1, 2]), np.array([3, 5]))),
        (_object_column(np.array([1, 2]), np.array([3, 4])), _object_column(np.array([1, 2]), np.array([3, 4, 5]))),
        (_object_column([1.0, np.nan], "x"), _object_column([np.nan, 1.0], "x")),
        (_object_column({"k": 1}, "x"), _object_column({"k": 2}, "x")),
    ],
)
def test_union_still_rejects_different_values(left, right):
    with pytest.raises(ValueError, match="non-tensor 'b' differs"):
        DataProto(non_tensor_batch={"b": left}).union(DataProto(non_tensor_batch={"b": right}))


def test_union_of_a_self_referencing_object_column_is_a_clear_value_error():
    first, second = [1], [1]
    first.append(first)
    second.append(second)
    left = DataProto(non_tensor_batch={"loop": _object_column(first, "x")})
    right = DataProto(non_tensor_batch={"loop": _object_column(second, "x")})
    with pytest.raises(ValueError, match="non-tensor 'loop' holds a value that contains itself"):
        left.union(right)
    # The very same object is equal to itself without walking into it.
    assert len(left.union(DataProto(non_tensor_batch={"loop": left.non_tensor_batch["loop"]}))) == 2


def test_indexing_by_a_tensor_raises_no_numpy_deprecation_warning():
    import warnings

    dp = make(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        picked = dp[torch.tensor([4, 0])]
        masked = dp[torch.tensor([True, False, True, False, False])]
        from_numpy = dp[np.array([1, 2])]
    assert picked.non_tensor_batch["tag"].tolist() == ["row4", "row0"]
    assert masked.batch["x"].tolist() == [0.0, 2.0]
    assert from_numpy.batch["x"].tolist() == [1.0, 2.0]


# ---------------------------------------------------------------------------------- rows
@pytest.mark.parametrize("rows,chunks", [(10, 3), (9, 3), (2, 5), (0, 3), (7, 1), (7, 7), (1, 2)])
def test_chunk_gives_exactly_k_ordered_pieces_differing_by_at_most_one(rows, chunks):
    dp = make(rows)
    pieces = dp.chunk(chunks)
    assert len(pieces) == chunks
    sizes = [len(piece) for piece in pieces]
    assert sum(sizes) == rows
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger pieces come first
    assert [i for piece in pieces for i in rows_of(piece)] == list(range(rows))
    for piece in pieces:
        assert_row_aligned(piece)
        assert piece.meta_info == dp.meta_info


def test_chunk_and_split_reject_non_positive_sizes():
    with pytest.raises(ValueError):
        make(3).chunk(0)
    with pytest.raises(ValueError):
        make(3).split(0)


@pytest.mark.parametrize("rows,size,expected", [(10, 4, [4, 4, 2]), (8, 4, [4, 4]), (3, 5, [3]), (0, 2, [])])
def test_split_gives_consecutive_pieces_of_split_size(rows, size, expected):
    pieces = make(rows).split(size)
    assert [len(p) for p in pieces] == expected
    assert [i for p in pieces for i in rows_of(p)] == list(range(rows))


def test_concat_joins_rows_in_order_with_the_first_meta_info():
    a, b = make(5, meta={"m": 1})[[0, 1]], make(5, meta={"m": 2})[[2, 3, 4]]
    out = DataProto.concat([a, b])
    assert rows_of(out) == [0, 1, 2, 3, 4]
    assert_row_aligned(out)
    assert out.meta_info == {"m": 1}
    assert len(a) == 2 and len(b) == 3


def test_concat_with_mismatched_columns_raises():
    a = make(2)
    b = make(2).select(batch_keys=["x"])
    with pytest.raises(ValueError, match="part 1 has columns"):
        DataProto.concat([a, b])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


@pytest.mark.parametrize("interleave,expected", [(True, [0, 0, 0, 1, 1, 1, 2, 2, 2]), (False, [0, 1, 2, 0, 1, 2, 0, 1, 2])])
def test_repeat_interleaved_or_tiled(interleave, expected):
    dp = make(3)
    out = dp.repeat(3, interleave=interleave)
    assert rows_of(out) == expected
    assert_row_aligned(out)
    assert len(dp) == 3
    with pytest.raises(ValueError):
        dp.repeat(0)


@pytest.mark.parametrize("rows,divisor,pad", [(5, 2, 1), (5, 4, 3), (2, 5, 3), (1, 3, 2), (6, 3, 0), (4, 1, 0)])
def test_pad_to_divisor_repeats_rows_from_the_start_and_unpad_restores(rows, divisor, pad):
    dp = make(rows)
    before = snapshot(dp)
    padded, got_pad = dp.pad_to_divisor(divisor)
    assert got_pad == pad
    assert len(padded) % divisor == 0
    assert rows_of(padded) == list(range(rows)) + [i % rows for i in range(pad)]
    assert_row_aligned(padded)
    assert dp.equals(before) and len(dp) == rows  # input never mutated
    restored = padded.unpad(got_pad)
    assert restored.equals(dp)
    assert padded.unpad(got_pad) is not None and len(padded) == rows + pad  # unpad does not mutate either


def test_pad_to_divisor_rejects_empty_batches_and_bad_divisors():
    with pytest.raises(ValueError, match="empty"):
        make(0).pad_to_divisor(2)
    with pytest.raises(ValueError, match="positive"):
        make(3).pad_to_divisor(0)


# ---------------------------------------------------------------------------------- misc
def test_nbytes_counts_tensors_and_numeric_arrays():
    dp = DataProto.from_dict(tensors={"a": torch.zeros(4, 2, dtype=torch.int64)}, non_tensors={"b": np.zeros(4), "c": [[1]] * 4})
    assert dp.nbytes() == 4 * 2 * 8 + 4 * 8


def test_equals_compares_columns_values_and_meta_info():
    assert make(3).equals(make(3))
    assert not make(3).equals(make(3, meta={"step": 2}))
    assert not make(3).equals(make(4))
    assert not make(3).equals(make(3).select(batch_keys=["x"]))
    other = make(3)
    other.batch["x"] = other.batch["x"] + 1
    assert not make(3).equals(other)


def test_repr_lists_shapes_and_dtypes():
    text = repr(make(2))
    assert "len=2" in text and "x: (2,) float32" in text and "ids: (2, 3) int64" in text


# ---------------------------------------------------------------------------------- pickling
def test_bfloat16_and_other_dtypes_round_trip_through_pickle():
    dp = DataProto.from_dict(
        tensors={
            "bf16": torch.randn(6, 4).to(torch.bfloat16),
            "f16": torch.randn(6).half(),
            "f32": torch.randn(6, 2),
            "i64": torch.arange(6),
            "bool": torch.tensor([True, False] * 3),
            "u8": torch.arange(6, dtype=torch.uint8),
        },
        non_tensors={"obj": [{"i": i} for i in range(6)]},
        meta_info={"nested": {"a": [1, 2]}},
    )
    for protocol in (4, 5):
        back = pickle.loads(pickle.dumps(dp, protocol=protocol))
        assert back.equals(dp)
        for key, tensor in dp.batch.items():
            assert back.batch[key].dtype == tensor.dtype
            assert back.batch[key].shape == tensor.shape


def test_pickled_state_carries_tensors_as_numpy_arrays():
    bf16 = torch.randn(3, 2).to(torch.bfloat16)
    dp = DataProto.from_dict(tensors={"x": torch.arange(3.0), "bf16": bf16}, non_tensors={"t": ["a", "b", "c"]})
    state = dp.__getstate__()
    assert set(state) == {"batch", "non_tensor_batch", "meta_info"}
    for key, (dtype_name, array) in state["batch"].items():
        assert isinstance(array, np.ndarray), key
        assert not isinstance(array, torch.Tensor)
    assert state["batch"]["x"][0] == "float32"
    # bfloat16 has no numpy dtype: it travels as its raw 16-bit pattern.
    assert state["batch"]["bf16"][0] == "bfloat16" and state["batch"]["bf16"][1].dtype == np.int16
    assert np.array_equal(state["batch"]["bf16"][1], bf16.view(torch.int16).numpy())
    # The arrays are views of the tensors (no copy when pickling a contiguous CPU tensor).
    assert np.shares_memory(state["batch"]["x"][1], dp.batch["x"].numpy())


def test_pickling_a_non_contiguous_slice_ships_only_its_rows():
    big = torch.arange(40.0).reshape(10, 4)
    dp = DataProto.from_dict(tensors={"t": big.t()})  # non-contiguous view, 4 rows of 10
    back = pickle.loads(pickle.dumps(dp, protocol=5))
    assert torch.equal(back.batch["t"], big.t())
    shard = DataProto.from_dict(tensors={"x": torch.arange(100_000.0)})[slice(0, 10)]
    assert len(pickle.dumps(shard, protocol=5)) < 10_000


def test_to_moves_tensors_and_keeps_the_rest():
    dp = make(2, meta={"a": 1})
    moved = dp.to("cpu")
    assert moved.equals(dp) and moved is not dp and moved.batch is not dp.batch


# ---------------------------------------------------------------------------------- Ray
def _big_dataproto() -> DataProto:
    rows = 1 << 18
    return DataProto.from_dict(
        tensors={"ids": torch.arange(rows * 4, dtype=torch.int64).reshape(rows, 4), "bf16": torch.randn(rows).bfloat16()},
        non_tensors={"score": np.arange(rows, dtype=np.float64), "small": [{"i": i % 7} for i in range(rows)]},
        meta_info={"step": 5},
    )


def test_copy_mode_gives_each_receiver_a_private_copy(ray_session, monkeypatch):
    import ray

    import rlhfctl.protocol

    monkeypatch.setattr(rlhfctl.protocol, "ZERO_COPY", False)  # what RLHFCTL_ZERO_COPY=0 selects
    dp = _big_dataproto()
    ref = ray.put(dp)
    first, second = ray.get(ref), ray.get(ref)
    assert first.equals(dp)
    assert first.batch["bf16"].dtype == torch.bfloat16
    # The receiver copies out of shared memory once, so an in-place write is private.
    assert first.batch["ids"].data_ptr() != second.batch["ids"].data_ptr()
    first.batch["ids"].add_(1)
    assert torch.equal(ray.get(ref).batch["ids"], dp.batch["ids"])


def test_received_tensors_are_zero_copy_views_of_the_object_store_by_default(ray_session):
    import ray

    import rlhfctl.protocol

    assert rlhfctl.protocol.ZERO_COPY  # the default (RLHFCTL_ZERO_COPY unset)
    dp = _big_dataproto()
    ref = ray.put(dp)
    first, second = ray.get(ref), ray.get(ref)
    assert first.equals(dp)
    assert first.batch["bf16"].dtype == torch.bfloat16
    # Two gets map the same shared memory, which is neither the sender's memory nor a private copy.
    assert first.batch["ids"].data_ptr() == second.batch["ids"].data_ptr()
    assert first.batch["ids"].data_ptr() != dp.batch["ids"].data_ptr()
    score = first.non_tensor_batch["score"]
    assert not score.flags.writeable and not score.flags.owndata


def test_ray_round_trip_of_small_and_empty_dataprotos(ray_session):
    import ray

    for dp in (make(0), make(1), make(7, meta={"m": [1, {"x": 2}]}), DataProto(meta_info={"only": "meta"})):
        assert ray.get(ray.put(dp)).equals(dp)


# ---------------------------------------------------------------------------------- properties
@st.composite
def dataprotos(draw, min_rows: int = 0, max_rows: int = 40) -> DataProto:
    rows = draw(st.integers(min_rows, max_rows))
    width = draw(st.integers(1, 3))
    values = draw(st.lists(st.integers(-1000, 1000), min_size=rows * width, max_size=rows * width))
    tags = draw(st.lists(st.text(max_size=3), min_size=rows, max_size=rows))
    return DataProto.from_dict(
        tensors={
            "v": torch.tensor(values, dtype=torch.int64).reshape(rows, width),
            "pos": torch.arange(rows, dtype=torch.float32),
        },
        non_tensors={"tag": tags, "obj": [[i] * (i % 2) for i in range(rows)]},
        meta_info={"n": rows},
    )


PROPERTY_SETTINGS = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(dataprotos(), st.integers(1, 12))
def test_property_concat_of_chunks_is_the_original(dp, k):
    pieces = dp.chunk(k)
    assert len(pieces) == k
    sizes = [len(p) for p in pieces]
    assert max(sizes) - min(sizes) <= 1
    assert DataProto.concat(pieces).equals(dp)


@PROPERTY_SETTINGS
@given(dataprotos(), st.integers(1, 12))
def test_property_concat_of_splits_is_the_original(dp, size):
    pieces = dp.split(size)
    if len(dp):
        assert DataProto.concat(pieces).equals(dp)
        assert all(len(p) == size for p in pieces[:-1])
    else:
        assert pieces == []


@PROPERTY_SETTINGS
@given(dataprotos(min_rows=1), st.integers(1, 12))
def test_property_unpad_of_pad_is_the_original(dp, divisor):
    before = snapshot(dp)
    padded, pad = dp.pad_to_divisor(divisor)
    assert len(padded) % divisor == 0 and 0 <= pad < divisor
    assert padded.batch["pos"].tolist() == [float(i % len(dp)) for i in range(len(padded))]
    assert padded.unpad(pad).equals(dp)
    assert dp.equals(before)


@PROPERTY_SETTINGS
@given(dataprotos(), st.integers(1, 5), st.booleans())
def test_property_repeat_lengths_and_rows(dp, times, interleave):
    out = dp.repeat(times, interleave=interleave)
    n = len(dp)
    assert len(out) == n * times
    expected = [i for i in range(n) for _ in range(times)] if interleave else [i for _ in range(times) for i in range(n)]
    assert out.batch["pos"].tolist() == [float(i) for i in expected]
    assert list(out.non_tensor_batch["tag"]) == [dp.non_tensor_batch["tag"][i] for i in expected]


@PROPERTY_SETTINGS
@given(dataprotos())
def test_property_pickle_round_trip(dp):
    assert pickle.loads(pickle.dumps(dp, protocol=5)).equals(dp)
