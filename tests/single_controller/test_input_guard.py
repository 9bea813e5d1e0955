"""The opt-in check that registered methods never write into the batches they were sent."""

from __future__ import annotations

import pytest
import torch

from rlhfctl.protocol import DataProto
from rlhfctl.single_controller import Dispatch, register
from rlhfctl.single_controller.input_guard import CHECK_INPUTS_ENV, InputWrittenError


class Scorer:
    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def scale_in_place(self, data: DataProto, factor: float = 2.0) -> DataProto:
        data.batch["scores"].mul_(factor)
        return data

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def scale_into_new_tensor(self, data: DataProto, factor: float = 2.0) -> DataProto:
        data.batch["scores"] = data.batch["scores"] * factor  # rebinding the key is not an in-place write
        return data

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def write_keyword(self, *, data: DataProto) -> None:
        data.batch["ids"][0, 0] = 7


def batch() -> DataProto:
    return DataProto.from_dict({"scores": torch.ones(4), "ids": torch.zeros(4, 3, dtype=torch.int64),
                                "bf16": torch.ones(4, 2, dtype=torch.bfloat16)})


def test_an_in_place_write_is_named_by_method_argument_and_tensor(monkeypatch):
    monkeypatch.setenv(CHECK_INPUTS_ENV, "1")
    with pytest.raises(InputWrittenError, match=r"Scorer.scale_in_place wrote in place into tensor 'scores' "
                                                r"of its positional argument 1"):
        Scorer().scale_in_place(batch())
    with pytest.raises(InputWrittenError, match=r"tensor 'ids' of its argument 'data'"):
        Scorer().write_keyword(data=batch())


def test_new_tensors_and_unchanged_inputs_pass(monkeypatch):
    monkeypatch.setenv(CHECK_INPUTS_ENV, "1")
    data = batch()
    out = Scorer().scale_into_new_tensor(data)
    assert out.batch["scores"].tolist() == [2.0] * 4
    assert data.batch["scores"].tolist() == [2.0] * 4  # same dict, new tensor: the original tensor is intact


def test_the_check_is_off_unless_asked(monkeypatch):
    monkeypatch.setenv(CHECK_INPUTS_ENV, "0")
    data = batch()
    original = data.batch["scores"]
    Scorer().scale_in_place(data)
    assert original.tolist() == [2.0] * 4
