"""The weight channel: rank 0 broadcasts buckets of mixed-dtype tensors; every receiver gets them bit for bit."""

from __future__ import annotations

import multiprocessing
import socket

import torch

from rlhfctl.rollout.weight_channel import SyncAddress, WeightChannel, bucketed


def _weights() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(17, 8, generator=generator).to(torch.bfloat16)),
        ("norm.weight", torch.randn(8, generator=generator)),
        ("scale", torch.tensor(3.5, dtype=torch.float64)),
        ("layer.weight", torch.randn(5, 3, generator=generator).to(torch.float16)),
        ("counts", torch.arange(7, dtype=torch.int64)),
    ]


def _member(rank: int, address: SyncAddress, results: multiprocessing.Queue, read: multiprocessing.Event) -> None:
    channel = WeightChannel(address, rank, torch.device("cpu"), timeout_s=60)
    for round_ in range(2):  # two syncs over one channel
        if rank == 0:
            results.put((rank, round_, channel.send(bucketed(_weights(), bucket_bytes=100))))
        else:
            results.put((rank, round_, [(name, tensor.clone()) for name, tensor in channel.receive()]))
    # A queued tensor is shared by file descriptor, which its sender hands over while it lives: exit only once the
    # test has read every result (exiting first failed the read now and then, "No such file or directory").
    read.wait(timeout=120)


def test_every_receiver_gets_every_tensor_bit_for_bit_in_order():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = SyncAddress("127.0.0.1", port, world_size=3)
    context = multiprocessing.get_context("spawn")
    results, read = context.Queue(), context.Event()
    members = [context.Process(target=_member, args=(rank, address, results, read)) for rank in range(3)]
    for member in members:
        member.start()
    try:
        got = [results.get(timeout=120) for _ in range(6)]
    finally:
        read.set()
    for member in members:
        member.join(timeout=60)
        assert member.exitcode == 0
    expected = _weights()
    sent = [value for rank, _, value in got if rank == 0]
    assert sent == [sum(t.numel() * t.element_size() for _, t in expected)] * 2
    received = [value for rank, _, value in got if rank != 0]
    assert len(received) == 4
    for tensors in received:
        assert [name for name, _ in tensors] == [name for name, _ in expected]
        for (_, got_tensor), (_, want) in zip(tensors, expected):
            assert got_tensor.dtype == want.dtype and got_tensor.shape == want.shape
            assert torch.equal(got_tensor, want)


def test_buckets_hold_whole_tensors_of_about_the_given_size():
    weights = _weights()
    buckets = list(bucketed(weights, bucket_bytes=100))
    assert [name for bucket in buckets for name, _ in bucket] == [name for name, _ in weights]
    assert len(buckets) > 1
    for bucket in buckets[:-1]:
        assert sum(t.numel() * t.element_size() for _, t in bucket) >= 100
    assert list(bucketed(weights, bucket_bytes=10**9)) == [weights]
