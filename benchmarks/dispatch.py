"""Per-call cost of a worker-group call against the same work done with raw Ray actor calls.

Both sides run world size 2 in one Ray session and are measured side by side (interleaved, alternating
which goes first), with warm-up calls and the median of ``--repeats`` timed calls (``--noop-repeats`` for the
no-op, default 200: it takes about 2 ms, and 20 samples of it move by +-20% on a shared 2-core machine):

- ``noop``: ``group.noop()`` (``Dispatch.ONE_TO_ALL``, no arguments) against
  ``ray.get([a.noop.remote(), b.noop.remote()])``.
- ``send``: a batch of ``input_ids`` + ``attention_mask`` (int64, rows x 2048) goes out split in two
  halves; each rank returns a small per-row score. Ours: ``@register(Dispatch.ALL_TO_ALL)`` taking a
  DataProto; raw: each actor receives its half as two numpy arrays.
- ``roundtrip``: the same, but each rank echoes its half back (ours concatenates the halves into one
  DataProto on the driver, as every ALL_TO_ALL call does; raw leaves them as two tuples of arrays).

Run from the repository root::

    .venv/bin/python benchmarks/dispatch.py                     # defaults: sizes 0.3,4,32 MB, 20 repeats
    .venv/bin/python benchmarks/dispatch.py --repeats 50 --sizes 1,8 --json results.json
    .venv/bin/python benchmarks/dispatch.py --trace             # with the dispatch trace recording, as in training

``--trace`` attaches the trainer's dispatch trace (a ``TraceRecorder`` observing every call) to the group and
drains the ranks' spans after each case, outside the timed calls, so the table shows what the trace costs a call.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402

from rlhfctl.protocol import DataProto  # noqa: E402
from rlhfctl.ray_cluster import start_or_join_ray  # noqa: E402
from rlhfctl.trace import TraceRecorder  # noqa: E402
from rlhfctl.single_controller import (  # noqa: E402
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    register,
)

COLUMNS = 2048
BYTES_PER_ROW = 2 * COLUMNS * 8  # input_ids + attention_mask, int64
WORLD_SIZE = 2


# ---------------------------------------------------------------------------------- the two sides
class BenchWorker(Worker):
    """Our side: a role worker whose methods do as little as the raw actor's."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def score(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"score": data.batch["input_ids"][:, 0].float()})

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def echo(self, data: DataProto) -> DataProto:
        return data


@ray.remote(num_cpus=0)
class RawActor:
    """The baseline: a plain Ray actor receiving numpy arrays."""

    def noop(self) -> None:
        return None

    def score(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return input_ids[:, 0].astype(np.float32)

    def echo(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return input_ids, attention_mask


# ---------------------------------------------------------------------------------- measuring
def rows_for(megabytes: float) -> int:
    """Rows of 2 x 2048 int64 closest to ``megabytes`` MiB, even so both ranks get the same half."""
    rows = round(megabytes * 2**20 / BYTES_PER_ROW)
    return max(2, rows + rows % 2)


def make_batch(rows: int) -> DataProto:
    generator = torch.Generator().manual_seed(rows)
    input_ids = torch.randint(0, 32_000, (rows, COLUMNS), dtype=torch.int64, generator=generator)
    attention_mask = torch.ones(rows, COLUMNS, dtype=torch.int64)
    return DataProto.from_dict(tensors={"input_ids": input_ids, "attention_mask": attention_mask})


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000.0


def side_by_side(ours: Callable[[], Any], raw: Callable[[], Any], warmup: int, repeats: int) -> tuple[list[float], list[float]]:
    """Interleave the two, alternating which goes first, and return the timed calls (ms) of each."""
    for _ in range(warmup):
        ours()
        raw()
    ours_ms, raw_ms = [], []
    for i in range(repeats):
        if i % 2:
            raw_ms.append(timed(raw))
            ours_ms.append(timed(ours))
        else:
            ours_ms.append(timed(ours))
            raw_ms.append(timed(raw))
    return ours_ms, raw_ms


def summarize(case: str, megabytes: float, rows: int, ours_ms: list[float], raw_ms: list[float]) -> dict[str, Any]:
    ours, raw = statistics.median(ours_ms), statistics.median(raw_ms)
    return {
        "case": case,
        "mb": round(megabytes, 3),
        "rows": rows,
        "ours_ms": round(ours, 3),
        "raw_ms": round(raw, 3),
        "ratio": round(ours / raw, 3) if raw > 0 else None,
        "extra_ms": round(ours - raw, 3),
        "ours_min_ms": round(min(ours_ms), 3),
        "raw_min_ms": round(min(raw_ms), 3),
        "ours_samples_ms": [round(v, 3) for v in ours_ms],
        "raw_samples_ms": [round(v, 3) for v in raw_ms],
    }


def run(sizes: list[float], repeats: int, warmup: int, num_cpus: int, trace: bool = False,
        noop_repeats: int | None = None) -> dict[str, Any]:
    session = start_or_join_ray(num_cpus=num_cpus, env_vars={"OMP_NUM_THREADS": "1"})
    pool = RayResourcePool([WORLD_SIZE], name="bench-dispatch")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(BenchWorker), role="bench")
    actors = [RawActor.remote() for _ in range(WORLD_SIZE)]
    recorder = TraceRecorder() if trace else None
    if recorder is not None:
        group.observers.append(recorder)
    results = []

    def drain_trace() -> None:
        if recorder is not None:  # between cases, untimed: the trainer drains once per step
            recorder.drain_workers([group])

    try:
        ray.get([actor.noop.remote() for actor in actors])

        def raw_noop() -> None:
            ray.get([actor.noop.remote() for actor in actors])

        noop_repeats = noop_repeats or repeats
        results.append(summarize("noop", 0.0, 0, *side_by_side(group.noop, raw_noop, warmup, noop_repeats)))
        drain_trace()

        for megabytes in sizes:
            rows = rows_for(megabytes)
            batch = make_batch(rows)
            ids, mask = batch.batch["input_ids"].numpy(), batch.batch["attention_mask"].numpy()
            half = rows // 2
            actual_mb = batch.nbytes() / 2**20

            # Correctness once, so the benchmark measures the right thing.
            assert group.echo(batch).equals(batch)
            assert group.score(batch).batch["score"].tolist() == batch.batch["input_ids"][:, 0].float().tolist()

            def raw_call(method: str) -> Callable[[], Any]:
                def call() -> Any:
                    halves = [(ids[:half], mask[:half]), (ids[half:], mask[half:])]
                    return ray.get([getattr(actor, method).remote(i, m) for actor, (i, m) in zip(actors, halves)])

                return call

            for case, method in (("send", "score"), ("roundtrip", "echo")):
                ours_call = getattr(group, method)
                ours_ms, raw_ms = side_by_side(lambda: ours_call(batch), raw_call(method), warmup, repeats)
                results.append(summarize(case, actual_mb, rows, ours_ms, raw_ms))
                drain_trace()
    finally:
        group.shutdown()
        for actor in actors:
            ray.kill(actor)
        pool.release()
        session.shutdown()
    return {
        "config": {
            "world_size": WORLD_SIZE,
            "columns": COLUMNS,
            "repeats": repeats,
            "noop_repeats": noop_repeats,
            "warmup": warmup,
            "ray_num_cpus": num_cpus,
            "trace": trace,
            "traced_calls": len(recorder.calls) if recorder is not None else 0,
            "traced_rank_spans": len(recorder.worker_spans) if recorder is not None else 0,
            "machine_cores": os.cpu_count(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "torch": torch.__version__,
        },
        "results": results,
    }


# ---------------------------------------------------------------------------------- output
HEADERS = ["case", "MB", "rows", "ours ms", "raw ms", "ours/raw", "extra ms", "ours min", "raw min"]


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    out = []
    for r in report["results"]:
        out.append([
            r["case"],
            "-" if r["case"] == "noop" else f"{r['mb']:.2f}",
            "-" if r["case"] == "noop" else str(r["rows"]),
            f"{r['ours_ms']:.2f}",
            f"{r['raw_ms']:.2f}",
            f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-",
            f"{r['extra_ms']:+.2f}",
            f"{r['ours_min_ms']:.2f}",
            f"{r['raw_min_ms']:.2f}",
        ])
    return out


def plain_table(report: dict[str, Any]) -> str:
    rows = [HEADERS] + table_rows(report)
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("| " + " | ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def print_table(report: dict[str, Any], plain: bool) -> None:
    config = report["config"]
    title = (f"group call vs raw Ray actors, world size {config['world_size']}, median of {config['repeats']} "
             f"(noop {config['noop_repeats']}; after {config['warmup']} warm-up), {config['machine_cores']} cores"
             + (f", trace on ({config['traced_calls']} calls, {config['traced_rank_spans']} rank spans)"
                if config["trace"] else ""))
    if not plain:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            plain = True
    if plain:
        print(title)
        print(plain_table(report))
        return
    table = Table(title=title)
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right")
    for row in table_rows(report):
        table.add_row(*row)
    Console(width=None if sys.stdout.isatty() else 120).print(table)


def parse_sizes(text: str) -> list[float]:
    sizes = [float(part) for part in text.split(",") if part.strip()]
    if not sizes or any(size <= 0 for size in sizes):
        raise argparse.ArgumentTypeError(f"--sizes wants positive MB values separated by commas, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per case and side (median reported)")
    parser.add_argument("--noop-repeats", type=int, default=200,
                        help="timed calls of the no-op case per side (default 200; each is about 2 ms)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per case and side first")
    parser.add_argument("--sizes", type=parse_sizes, default=[0.3, 4.0, 32.0],
                        help="batch sizes in MB (MiB), comma separated (default 0.3,4,32)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="also save the results as JSON")
    parser.add_argument("--num-cpus", type=int, default=4, help="logical CPUs of the private local Ray")
    parser.add_argument("--plain", action="store_true", help="plain Markdown table instead of rich")
    parser.add_argument("--trace", action="store_true",
                        help="record the dispatch trace of our side, as every training run does")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.noop_repeats < 1 or args.warmup < 0:
        parser.error("--repeats and --noop-repeats must be >= 1 and --warmup >= 0")
    started = time.perf_counter()
    report = run(args.sizes, args.repeats, args.warmup, args.num_cpus, args.trace, args.noop_repeats)
    report["config"]["wall_s"] = round(time.perf_counter() - started, 1)
    print_table(report, args.plain)
    print(f"total {report['config']['wall_s']} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"saved {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
