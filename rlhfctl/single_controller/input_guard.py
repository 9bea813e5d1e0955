"""Catch a worker method that writes in place into a batch it was sent (``RLHFCTL_CHECK_INPUTS=1``).

Tensors reach a worker as zero-copy views of Ray's shared object store (and, on the local backend,
as views of the driver's own tensors). torch cannot make those read-only, so an in-place write such
as ``data.batch["scores"].add_(1)`` silently changes what the driver, the other ranks and any later
reader of the same object see. With the check on, every registered method fingerprints the tensors
of its DataProto arguments before it runs and compares after; a change raises
:class:`InputWrittenError` naming the method, the argument and the tensor. It reads every byte
twice, so it is meant for tests and debugging (the test suite turns it on), not for production runs.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import torch

from rlhfctl.protocol import DataProto

__all__ = ["CHECK_INPUTS_ENV", "InputWrittenError", "check_inputs_enabled", "fingerprint_inputs", "verify_inputs"]

CHECK_INPUTS_ENV = "RLHFCTL_CHECK_INPUTS"


class InputWrittenError(RuntimeError):
    """A worker method modified a tensor of a batch it received instead of copying it first."""


def check_inputs_enabled() -> bool:
    """True when ``RLHFCTL_CHECK_INPUTS=1`` is set in this process."""
    return os.environ.get(CHECK_INPUTS_ENV, "0") == "1"


def _tensor_crc(tensor: torch.Tensor) -> int:
    data = tensor.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    data = data.contiguous().reshape(-1).view(torch.uint8)
    return zlib.crc32(data.numpy())


def _dataprotos(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    named = [(f"positional argument {index}", value) for index, value in enumerate(args)]
    named += [(f"argument '{key}'", value) for key, value in kwargs.items()]
    return [(name, value) for name, value in named if isinstance(value, DataProto)]


def fingerprint_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[tuple[str, str], tuple[int, Any]]:
    """CRC32 of every tensor of every DataProto argument, keyed by (argument, tensor name)."""
    prints: dict[tuple[str, str], tuple[int, Any]] = {}
    for name, data in _dataprotos(args, kwargs):
        for key, tensor in data.batch.items():
            prints[(name, key)] = (_tensor_crc(tensor), tensor)
    return prints


def verify_inputs(before: dict[tuple[str, str], tuple[int, Any]], method: str) -> None:
    """Raise InputWrittenError when a tensor fingerprinted by :func:`fingerprint_inputs` has changed."""
    for (name, key), (crc, tensor) in before.items():
        if _tensor_crc(tensor) != crc:
            raise InputWrittenError(
                f"{method} wrote in place into tensor '{key}' of its {name}; received batches are shared, "
                "zero-copy views (other ranks and the driver read the same memory): clone the tensor before "
                "modifying it, or build a new one"
            )
