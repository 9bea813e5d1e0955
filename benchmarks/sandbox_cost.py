"""What one python-tool call costs: the namespace boundary against the sandbox before it (issue 36), paired.

Both tools run the same programs (``pass`` and ``import json``) through ``execute`` in one event loop, one call
at a time, alternating which goes first, on the same cores (the CPU affinity is set once, children inherit it).
"Before" is the tool as it was at ``--baseline`` (read with ``git show`` into a temporary folder), so the
comparison is against the code that shipped, not a mode of the new one. ``--phases`` also times the launcher's
steps from the outside (interpreter start, unshare, the whole call) to say where the time goes.

    .venv/bin/python benchmarks/sandbox_cost.py                  # 30 pairs per program
    .venv/bin/python benchmarks/sandbox_cost.py --repeats 100 --cpus 0 --json /tmp/sandbox.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhfctl.agents.tools import PythonSandbox  # noqa: E402

BASELINE = "739a459"
"""The last commit with the sandbox before the boundary (a process group, rlimits and a network namespace)."""
PROGRAMS = {"empty": "", "import json": "import json\nprint(json.dumps([1]))"}


def baseline_tool(rev: str, folder: Path) -> type:
    """The PythonSandbox class as of ``rev``, its child script beside it, imported from ``folder``."""
    for name in ("python_sandbox.py", "sandbox_child.py"):
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:rlhfctl/agents/tools/{name}"],
                              capture_output=True, text=True, check=True).stdout
        text = text.replace("from rlhfctl.agents.tools import sandbox_child", "import baseline_sandbox_child as sandbox_child")
        (folder / f"baseline_{name}").write_text(text)
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("baseline_python_sandbox", folder / "baseline_python_sandbox.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PythonSandbox


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def paired(tools: dict[str, Any], repeats: int, warmup: int) -> dict[str, dict[str, list[list[float]]]]:
    """[wall, CPU] seconds per call, per program and tool (CPU: user + system of every process the call started,
    all reaped by then); calls alternate between the tools, the first one swapping each round."""
    samples: dict[str, dict[str, list[list[float]]]] = {program: {name: [] for name in tools} for program in PROGRAMS}
    names = list(tools)
    for round_ in range(warmup + repeats):
        for program, code in PROGRAMS.items():
            for name in names if round_ % 2 == 0 else names[::-1]:
                cpu, started = _children_cpu_s(), time.perf_counter()
                result = await tools[name].execute("bench", {"code": code})
                took, cpu = time.perf_counter() - started, _children_cpu_s() - cpu
                assert result.metrics["ok"] == 1.0, (name, result.text)
                if round_ >= warmup:
                    samples[program][name].append([took, cpu])
    return samples


def phases(repeats: int) -> dict[str, float]:
    """Median milliseconds of what a call is made of, timed from outside: the interpreter alone, and with imports."""
    commands = {
        "python -I -S -c pass": [sys.executable, "-I", "-S", "-c", "pass"],
        "python -I -S + the launcher's imports": [sys.executable, "-I", "-S", "-c", "import ctypes, marshal, resource, signal"],
        "unshare -Urpmni --fork true (util-linux)": ["unshare", "-Urpmni", "--fork", "true"],
    }
    out = {}
    for label, command in commands.items():
        took = []
        for _ in range(repeats):
            started = time.perf_counter()
            if subprocess.run(command, capture_output=True, check=False).returncode != 0:
                break
            took.append(time.perf_counter() - started)
        if took:
            out[label] = 1000 * statistics.median(took)
    return out


def summary(samples: dict[str, dict[str, list[list[float]]]]) -> list[dict[str, Any]]:
    """Per program: medians and minima of wall and CPU milliseconds, and the median of the paired differences."""
    rows = []
    for program, by_tool in samples.items():
        row: dict[str, Any] = {"program": program}
        for index, kind in ((0, "wall"), (1, "cpu")):
            new = [1000 * sample[index] for sample in by_tool["boundary"]]
            old = [1000 * sample[index] for sample in by_tool["before"]]
            row.update({f"boundary_{kind}_ms": statistics.median(new), f"before_{kind}_ms": statistics.median(old),
                        f"extra_{kind}_ms": statistics.median(a - b for a, b in zip(new, old)),
                        f"boundary_{kind}_min_ms": min(new), f"before_{kind}_min_ms": min(old)})
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cpus", default=None, help="comma-separated CPU ids for both tools (default: as inherited)")
    parser.add_argument("--baseline", default=BASELINE, help="git revision of the sandbox before the boundary")
    parser.add_argument("--phases", action="store_true", help="also time the parts of a call from outside")
    parser.add_argument("--json", default=None, help="also write the config, summary and every sample here")
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    with tempfile.TemporaryDirectory() as folder:
        tools = {"boundary": PythonSandbox(), "before": baseline_tool(args.baseline, Path(folder))()}
        assert tools["boundary"].confined, f"this host refuses the boundary: {tools['boundary'].refusal}"
        samples = asyncio.run(paired(tools, args.repeats, args.warmup))
    rows = summary(samples)
    print(f"cpus {sorted(os.sched_getaffinity(0))}, {args.repeats} pairs per program, baseline {args.baseline}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| program | ms per call | boundary (median) | before (median) | paired extra | boundary min | before min |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        for kind in ("wall", "cpu"):
            print(f"| {row['program']} | {kind} | {row[f'boundary_{kind}_ms']:.1f} | {row[f'before_{kind}_ms']:.1f} "
                  f"| {row[f'extra_{kind}_ms']:+.1f} | {row[f'boundary_{kind}_min_ms']:.1f} | {row[f'before_{kind}_min_ms']:.1f} |")
    parts = phases(max(5, args.repeats // 3)) if args.phases else {}
    for label, ms in parts.items():
        print(f"  {label}: {ms:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": vars(args), "summary": rows, "phases_ms": parts,
                                               "samples_s": samples}, indent=1))


if __name__ == "__main__":
    main()
