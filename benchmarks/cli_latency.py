"""How long a user waits for a mistake to be reported: the median of 5 runs of each case, through the real CLI.

    python benchmarks/cli_latency.py [--repeats 5] [--json results.json] [--compare OTHER_CHECKOUT]

With ``--compare``, each case also runs from another checkout (``PYTHONPATH=OTHER_CHECKOUT``, e.g. a
``git worktree`` of an earlier commit), the two alternating run by run, and the table adds its median
and the ratio.

Cases: a key typo, a bad override value, and a missing data file, each for ``rlhfctl validate`` and
``rlhfctl train`` on the bundled quickstart. The target is under 2 s each (issue: mistakes fail before
the heavy imports). Beside them, in the same run, the floors a command cannot go below: the interpreter
starting (``python -c pass``) and ``rlhfctl --version`` (the CLI's own imports). Every case must exit 2
with an ``error: <key>: ...`` line naming the key; the table says so per case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 2.0
CASES = {  # name: (overrides, the key the error must name)
    "key typo": (["rollout.max_new_token=3"], "rollout.max_new_token"),
    "bad override": (["trainer.batch_size=abc"], "trainer.batch_size"),
    "missing file": (["data.train_files=[absent.jsonl]"], "data.train_files[0]"),
}


def timed_run(command: list[str], checkout: Path = ROOT) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of one run of ``command`` in ``checkout`` (its code first on the path), and what it printed."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    return time.perf_counter() - start, done


def median_of(command: list[str], repeats: int, other: Path | None = None) -> tuple[float, subprocess.CompletedProcess, float | None]:
    """The median wall time over ``repeats`` runs here, the last run's result, and (with ``other``) the median
    of the same command in the other checkout, the two alternating."""
    times, others, done = [], [], None
    for _ in range(repeats):
        seconds, done = timed_run(command)
        times.append(seconds)
        if other is not None:
            others.append(timed_run(command, other)[0])
    return statistics.median(times), done, (statistics.median(others) if others else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--compare", type=Path, default=None, help="another checkout to time the same cases in")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "rlhfctl.cli"]
    rows = []
    for name, command in (("python -c pass", [sys.executable, "-c", "pass"]), ("rlhfctl --version", [*cli, "--version"])):
        seconds, _, before = median_of(command, args.repeats, args.compare)
        rows.append({"case": name, "command": "-", "median_s": seconds, "other_s": before, "exit": 0, "names_key": None,
                     "under_target": None})
    for subcommand in ("validate", "train"):
        for name, (overrides, key) in CASES.items():
            seconds, done, before = median_of([*cli, subcommand, "quickstart", *overrides], args.repeats, args.compare)
            errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error: ")]
            rows.append({"case": name, "command": subcommand, "median_s": seconds, "other_s": before, "exit": done.returncode,
                         "names_key": any(line.startswith(f"error: {key}") or f"'{key}'" in line for line in errors),
                         "under_target": seconds < TARGET_S, "message": errors[0] if errors else ""})
    compared = " | --compare (s) | ratio" if args.compare else ""
    print(f"| case | command | median of {args.repeats} (s){compared} | exit | error names the key | under {TARGET_S:g} s |")
    print("|---|---|---|" + ("---|---|" if args.compare else "") + "---|---|---|")
    for row in rows:
        flag = "" if row["under_target"] is None else ("yes" if row["under_target"] else "NO")
        line = "" if row["names_key"] is None else ("yes" if row["names_key"] else "NO")
        other = f" | {row['other_s']:.2f} | {row['other_s'] / row['median_s']:.1f}x" if args.compare else ""
        print(f"| {row['case']} | {row['command']} | {row['median_s']:.2f}{other} | {row['exit']} | {line} | {flag} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    missed = [row for row in rows if row["under_target"] is False or row["names_key"] is False or
              (row["command"] != "-" and row["exit"] != 2)]
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
