"""Code execution as a reward: run the response's program against the row's tests in the python sandbox.

``roles.reward.function: rlhfctl.rewards:code``. The program is the response's last ```python block (else its
last ``` block, else the whole response); the tests are the row's ``ground_truth`` in one of the layouts of
:mod:`rlhfctl.rewards.code_tests`. Each response's tests run in one call of the python tool's sandbox
(:mod:`rlhfctl.agents.tools.python_sandbox`: new namespaces, a read-only root, no network, resource limits),
where :mod:`rlhfctl.rewards.code_harness` forks one child per case with its own time limit, so a program that
hangs costs at most ``timeout_s`` per case, and the other responses run beside it (``max_parallel`` at once).

The score is the fraction of cases passed; the named scores ``code_compiled`` (the program compiles) and
``code_timeouts`` (the fraction of cases stopped at the time limit) come with it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhfctl.rewards.batch import as_text, check_batch, is_column
from rlhfctl.rewards.code_harness import CASE_MARK, COMPILED_MARK, VALUE_CHARS, canonical_json
from rlhfctl.rewards.code_tests import TestSuite, extract_code, parse_tests
from rlhfctl.rewards.errors import RewardSettingError

__all__ = ["CodeLimits", "CodeRun", "code", "refusal_problem", "run_code_tests"]

SETTINGS = ("timeout_s", "memory_mib", "max_parallel", "allow_unconfined")
_KEY = "roles.reward.function_kwargs"
_START_S = 10.0
"""Added to a response's time budget (cases x timeout_s) for the sandbox's start and the compile."""
_LINE_CHARS = 600
"""Room per case line in the captured output, beside a call-based value (its JSON escaped again: twice)."""
_HARNESS = Path(__file__).with_name("code_harness.py")


@dataclass(frozen=True)
class CodeLimits:
    """The settings of one batch: per-case time and memory, responses at once, and the unconfined opt-out."""

    timeout_s: float = 5.0
    memory_mib: int = 512
    max_parallel: int = 4
    allow_unconfined: bool = False


@dataclass(frozen=True)
class CodeRun:
    """One response's outcome: whether it compiled, each case's status and whether it passed."""

    compiled: bool
    statuses: list[str]
    """Per case: ``done``, ``error``, ``timeout``, ``syntax`` (did not compile) or ``lost`` (no report)."""
    passed: list[bool]

    @property
    def score(self) -> float:
        """The fraction of cases passed."""
        return sum(self.passed) / len(self.passed)


def code(
    prompts: list[str],
    responses: list[str],
    ground_truth: list[Any],
    timeout_s: float = 5.0,
    memory_mib: int = 512,
    max_parallel: int | None = None,
    allow_unconfined: bool = False,
    **columns: Any,
) -> list[dict[str, float]]:
    """Per sample ``{"score": cases passed / cases, "code_compiled": 0|1, "code_timeouts": fraction timed out}``."""
    check_batch(prompts, responses, ground_truth=ground_truth, **columns)
    stray = [name for name, value in columns.items() if not is_column(value)]
    if stray:
        raise RewardSettingError(
            f"{_KEY}.{stray[0]}: code has no setting {stray[0]!r}; its settings are {', '.join(SETTINGS)}")
    limits = _limits(timeout_s, memory_mib, max_parallel, allow_unconfined)
    suites = [parse_tests(truth, row) for row, truth in enumerate(ground_truth)]
    runs = run_code_tests([extract_code(as_text(response)) for response in responses], suites, limits)
    return [{"score": run.score, "code_compiled": float(run.compiled),
             "code_timeouts": run.statuses.count("timeout") / len(run.statuses)} for run in runs]


code.known_function_kwargs = frozenset(SETTINGS)  # type: ignore[attr-defined]  # validate's unknown-key check


def _limits(timeout_s: Any, memory_mib: Any, max_parallel: Any, allow_unconfined: Any) -> CodeLimits:
    """The settings checked, each error naming its key."""
    def number(name: str, value: Any, kind: type, least: float) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)) \
                or value < least:
            raise RewardSettingError(f"{_KEY}.{name}: must be a{'n integer' if kind is int else ' number'} of at "
                                     f"least {least:g}, got {value!r}")
        return kind(value)

    if not isinstance(allow_unconfined, bool):
        raise RewardSettingError(f"{_KEY}.allow_unconfined: must be true or false, got {allow_unconfined!r}")
    parallel = min(4, os.cpu_count() or 1) if max_parallel is None else number("max_parallel", max_parallel, int, 1)
    return CodeLimits(number("timeout_s", timeout_s, float, 0.05), number("memory_mib", memory_mib, int, 64),
                      parallel, allow_unconfined)


def refusal_problem(allow_unconfined: bool) -> str | None:
    """Why the tests cannot run on this host (the kernel refuses the boundary and the opt-out is off), or None."""
    from rlhfctl.agents.tools.python_sandbox import boundary_refusal  # the agents package: only when code runs

    why = boundary_refusal(True)
    if not why or allow_unconfined:
        return None
    return (
        f"rlhfctl.rewards:code cannot build its sandbox on this host ({why}): the kernel refuses the user, mount "
        f"and PID namespaces it needs. Allow them (in a container: a seccomp profile that permits unshare and "
        f"mount), or set {_KEY}.allow_unconfined: true to run the tests with resource limits only, without the "
        f"boundary (docs/security.md)"
    )


def run_code_tests(codes: Sequence[str], suites: Sequence[TestSuite], limits: CodeLimits) -> list[CodeRun]:
    """Run each program against its suite, one sandbox call per program, ``limits.max_parallel`` at once."""
    from rlhfctl.agents.tools.python_sandbox import PythonSandbox, run_programs

    problem = refusal_problem(limits.allow_unconfined)
    if problem:
        raise RewardSettingError(problem)
    if not codes:
        return []
    harness = _HARNESS.read_text(encoding="utf-8")
    programs = [_program(harness, program, suite, limits) for program, suite in zip(codes, suites)]
    most_cases = max(len(suite.cases) for suite in suites)
    budget_s = most_cases * (limits.timeout_s + 0.5) + _START_S  # a backstop: the harness times each case
    sandbox = PythonSandbox(
        timeout_s=budget_s,
        cpu_s=int(budget_s) + 1,  # the harness's own; each case's child lowers it to timeout_s + 1
        memory_mb=limits.memory_mib,
        max_output_chars=(most_cases + 2) * (_LINE_CHARS + 2 * VALUE_CHARS),
        max_code_chars=max(len(program) for program in programs) + 1,
        max_concurrent=limits.max_parallel,
        allow_unconfined=limits.allow_unconfined,
    )
    results = run_programs(sandbox, programs)
    return [_outcome(result.text, suite, row) for row, (result, suite) in enumerate(zip(results, suites))]


def _program(harness: str, program: str, suite: TestSuite, limits: CodeLimits) -> str:
    """The harness's text and the call of its main() on this response's payload (no expected outputs)."""
    payload = {"code": program, "kind": suite.kind, "cases": suite.cases, "fn_name": suite.fn_name,
               "setup": suite.setup, "timeout_s": limits.timeout_s, "max_output_bytes": 16 * 1024 * 1024}
    return f"{harness}\n\nmain(json.loads({json.dumps(payload)!r}))\n"


def _outcome(text: str, suite: TestSuite, row: int) -> CodeRun:
    """Read the harness's lines and compare each case with what the suite expects."""
    total = len(suite.cases)
    compiled: bool | None = None
    reports: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith(COMPILED_MARK):
            compiled = line[len(COMPILED_MARK):].startswith("1")
        elif line.startswith(CASE_MARK):
            try:
                report = json.loads(line[len(CASE_MARK):])
                reports[int(report["i"])] = report
            except (ValueError, KeyError, TypeError):
                continue
    if compiled is None:  # the harness prints this before the code runs: the sandbox itself failed
        raise RuntimeError(f"code: the sandbox did not run the tests of sample {row}: {text[:500]}")
    if not compiled:
        return CodeRun(False, ["syntax"] * total, [False] * total)
    statuses = [reports.get(index, {}).get("status", "lost") for index in range(total)]
    passed = [status == "done" and _passes(reports[index], suite, index) for index, status in enumerate(statuses)]
    return CodeRun(True, statuses, passed)


def _passes(report: dict[str, Any], suite: TestSuite, index: int) -> bool:
    """Whether a case that ran through gave the expected output (stdio), value (call), or passed (assert)."""
    if suite.kind == "stdio":
        return report.get("out") == suite.expected[index]
    if suite.kind == "assert":
        return True
    expected = suite.expected[index]
    candidates = [expected] + ([expected[0]] if isinstance(expected, list) and len(expected) == 1 else [])
    if "value" in report:
        try:
            value = json.loads(report["value"])
        except ValueError:
            return False
        return any(value == candidate for candidate in candidates)
    return any(_digest(candidate) == report.get("value_sha") for candidate in candidates)


def _digest(value: Any) -> str:
    try:
        return hashlib.sha256(canonical_json(value).encode("utf-8", errors="replace")).hexdigest()
    except (TypeError, ValueError):
        return ""
