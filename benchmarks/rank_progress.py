"""What a progress report costs a rank: ``rank_progress.report`` per call, against the same loop without it.

    python benchmarks/rank_progress.py [--calls 1000000]

A decode loop calls ``report`` once per token. Between two sends (a quarter second apart) a call
only reads the clock, so the figure that matters is nanoseconds per call, next to what a token of the
tiniest model costs (about a millisecond on a CPU). The board here is the in-process one (the local
backend's); on Ray a send is one fire-and-forget actor call, at most four a second per rank.
"""

from __future__ import annotations

import argparse
import time

from rlhfctl.single_controller import rank_progress


def loop(calls: int, with_report: bool) -> float:
    """Seconds for ``calls`` iterations of a loop that does (or does not) report each iteration."""
    board = rank_progress.ProgressBoard()
    rank_progress._sink_state["local_board"] = board
    try:
        with rank_progress.calling("actor", "generate_sequences", 0):
            start = time.perf_counter()
            total = 0
            for done in range(1, calls + 1):
                total += done  # the loop's own (trivial) work
                if with_report:
                    rank_progress.report(done, calls, "tokens")
            return time.perf_counter() - start
    finally:
        rank_progress._sink_state["local_board"] = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    args = parser.parse_args()
    rounds = [(loop(args.calls, False), loop(args.calls, True)) for _ in range(3)]
    bare, reported = min(r[0] for r in rounds), min(r[1] for r in rounds)
    per_call_ns = (reported - bare) / args.calls * 1e9
    print(f"{args.calls} calls: bare loop {bare:.3f} s, with report {reported:.3f} s, "
          f"{per_call_ns:.0f} ns per report call (best of 3)")


if __name__ == "__main__":
    main()
