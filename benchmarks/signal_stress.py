"""Whether a stop signal is still named under load: the signal tests, run again and again beside busy CPUs.

    python benchmarks/signal_stress.py [--runs 20] [--load 2] [-k EXPR] [--timeout 600] [TEST_FILE ...]

A stop signal that reaches the driver while it waits inside Ray used to end the run as a plain
interrupt (exit 130 instead of 143, ``: saving step 2``): it depended on where the driver was when the
signal came, and a loaded machine (slow worker calls, long waits in ``ray.get``) made it likely. This
starts ``--load`` busy-loop processes beside the tests, runs the tests ``--runs`` times in a row, prints
one line per run and the count of passes, and always stops the busy loops it started (SIGTERM too: a
job started in the background ignores Ctrl-C). The log of a failed run is kept under ``--logs``.

Defaults: ``tests/reliability/test_signals.py`` and ``tests/reliability/test_signal_order.py``.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TESTS = ["tests/reliability/test_signals.py", "tests/reliability/test_signal_order.py"]
BUSY_LOOP = "while True: pass"


def start_load(count: int) -> list[subprocess.Popen]:
    """``count`` processes that each keep one CPU busy."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]


def stop_load(load: list[subprocess.Popen]) -> None:
    for process in load:
        process.kill()
    for process in load:
        process.wait()


def run_once(tests: list[str], expression: str | None, timeout: float) -> tuple[bool, float, str]:
    """One pytest run of ``tests``: (passed, seconds, its output)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    if expression:
        command += ["-k", expression]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        passed, output = done.returncode == 0, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        passed, output = False, f"timed out after {timeout:.0f} s\n{expired.stdout or ''}"
    return passed, time.monotonic() - started, output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", nargs="*", default=DEFAULT_TESTS)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--load", type=int, default=2, help="busy-loop processes beside the tests")
    parser.add_argument("-k", dest="expression", default=None, help="pytest -k expression")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one pytest run may take")
    parser.add_argument("--logs", type=Path, default=Path("signal_stress_logs"))
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the finally stops the load
    load = start_load(args.load)
    passes, started = 0, time.monotonic()
    try:
        for run in range(1, args.runs + 1):
            passed, seconds, output = run_once(args.tests, args.expression, args.timeout)
            passes += passed
            if not passed:
                args.logs.mkdir(parents=True, exist_ok=True)
                (args.logs / f"run{run}.log").write_text(output)
            summary = output.strip().splitlines()[-1] if output.strip() else ""
            print(f"run {run}: {'pass' if passed else 'FAIL'} in {seconds:.0f} s ({summary})", flush=True)
    finally:
        stop_load(load)
    print(f"{passes}/{args.runs} passed with {args.load} busy CPU(s), {time.monotonic() - started:.0f} s in all")
    return 0 if passes == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
