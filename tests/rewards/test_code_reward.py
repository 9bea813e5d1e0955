"""rlhfctl.rewards:code runs each response's program against the row's tests in the python tool's real sandbox:
correct, wrong, crashing, slow and malicious programs, in the stdin/stdout, call-based and assert layouts."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path

import pytest

import rlhfctl.rewards
from rlhfctl.agents.tools import python_sandbox
from rlhfctl.rewards import RewardSettingError, code
from rlhfctl.rewards.code_execution import CodeLimits, _program, run_code_tests
from rlhfctl.rewards.code_tests import extract_code, parse_tests

pytestmark = pytest.mark.skipif(
    bool(python_sandbox.boundary_refusal()),
    reason=f"this kernel refuses the sandbox's namespaces ({python_sandbox.boundary_refusal()})",
)

REPO = Path(__file__).resolve().parents[2]
ADD = {"inputs": ["1 2\n", "3 4\n", "10 -5\n"], "outputs": ["3\n", "7", "5  \n\n"]}
ADD_JSON = json.dumps(ADD)
FENCED_ADD = "Here you go:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\nDone."
CALL = {"fn_name": "add", "inputs": [[1, 2], "3\n4", [[1], [2]]], "outputs": [3, [7], [1, 2]]}
ASSERTS = "import math\ndef twice(x):\n    return 2 * x\nassert add(1, 2) == 3\nassert add(twice(2), 1) == 5\nassert add(0, 0) == 1"

# name -> (response, ground_truth, score, compiled)
TABLE = {
    "correct stdio (fenced, JSON string)": (FENCED_ADD, ADD_JSON, 1.0, 1.0),
    "correct stdio (bare, dict)": ("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)", ADD, 1.0, 1.0),
    "wrong on 1 of 3": ("a, b = map(int, input().split())\nprint(a + abs(b))", ADD, 2 / 3, 1.0),
    "wrong everywhere": ("print(42)", ADD, 0.0, 1.0),
    "raises": ("a, b = map(int, input().split())\nprint(a / 0)", ADD, 0.0, 1.0),
    "syntax error": ("```python\ndef f(:\n```", ADD, 0.0, 0.0),
    "right output then exit 3": ("a, b = map(int, input().split())\nprint(a + b)\nraise SystemExit(3)", ADD, 0.0, 1.0),
    "right output, sys.exit(0)": ("import sys\na, b = map(int, input().split())\nprint(a + b)\nsys.exit(0)", ADD, 1.0, 1.0),
    "call-based, top-level function": ("def add(a, b):\n    return a + b", CALL, 1.0, 1.0),
    "call-based, LeetCode class": ("class Solution:\n    def add(self, a, b):\n        return a + b", CALL, 1.0, 1.0),
    "call-based, tuples compare as lists": ("def add(a, b):\n    return (a + b,) if isinstance(a, int) else tuple(a + b)",
                                            CALL, 2 / 3, 1.0),  # (3,) is not 3; (7,) is [7]; (1, 2) is [1, 2]
    "call-based, no such function": ("def plus(a, b):\n    return a + b", CALL, 0.0, 1.0),
    "asserts: 2 of 3": ("def add(a, b):\n    return a + b", ASSERTS, 2 / 3, 1.0),
    "assert list": ("def add(a, b):\n    return a + b", ["assert add(1, 1) == 2", "assert add(2, 2) == 4"], 1.0, 1.0),
    "asserts skipped by exit(0)": ("import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b", ASSERTS, 0.0, 1.0),
    "asserts skipped by os._exit(0)": ("import os\nos._exit(0)", ["assert True"], 0.0, 1.0),
    "infinite loop": ("while True:\n    pass", ADD, 0.0, 1.0),
    "reads /etc/hostname": ("print(open('/etc/hostname').read())", "HOSTNAME", 0.0, 1.0),
    "reads the repo": (f"print(open({str(REPO / 'pyproject.toml')!r}).read())", "PYPROJECT", 0.0, 1.0),
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", ADD, 0.0, 1.0),
    "kills its parent and everything": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
                                        "os.kill(-1, signal.SIGKILL)", ADD, 0.0, 1.0),
    "allocates 4 GiB": ("x = bytearray(4 << 30)\nprint(3)", ADD, 0.0, 1.0),
    "huge output": ("import sys\nwhile True:\n    sys.stdout.write('y' * 65536)", ADD, 0.0, 1.0),
}
TIMEOUT_S = 0.5


def _truth(value):
    """The host's own files as expected output: a program that could read them would pass."""
    if value == "HOSTNAME":
        return {"inputs": [""], "outputs": [Path("/etc/hostname").read_text() if Path("/etc/hostname").exists() else "x"]}
    if value == "PYPROJECT":
        return {"inputs": [""], "outputs": [(REPO / "pyproject.toml").read_text()]}
    return value


@pytest.fixture(scope="module")
def table_scores():
    """The whole table as one batch, as the reward worker calls it, and how long it took."""
    names = list(TABLE)
    _CHILDREN_BEFORE.update(_children())  # a test process shared with other test files may have children already
    started = time.monotonic()
    scores = code([f"prompt {name}" for name in names], [TABLE[name][0] for name in names],
                  [_truth(TABLE[name][1]) for name in names], timeout_s=TIMEOUT_S, max_parallel=2,
                  data_source=["codecontests"] * len(names))
    return dict(zip(names, scores)), time.monotonic() - started


@pytest.mark.parametrize("name", list(TABLE))
def test_each_program_scores_the_fraction_of_its_tests_passed(table_scores, name):
    scores, _ = table_scores
    _, _, score, compiled = TABLE[name]
    assert scores[name]["score"] == pytest.approx(score)
    assert scores[name]["code_compiled"] == compiled


def test_a_hanging_program_times_out_per_case_and_the_batch_ends_in_bounded_time(table_scores):
    scores, seconds = table_scores
    assert scores["infinite loop"]["code_timeouts"] == 1.0  # each of its 3 cases was stopped at the limit
    assert scores["correct stdio (fenced, JSON string)"]["code_timeouts"] == 0.0
    # 3 cases x 0.5 s for the loop, the same for the fork bomb and the output flood, the rest in ms: 2 at once
    assert seconds < 40, seconds


def test_case_statuses_say_what_happened():
    suite = parse_tests(ADD, 0)
    runs = run_code_tests(["while True: pass", "print(1/0)", "x = (", "print(3)"], [suite] * 4,
                          CodeLimits(timeout_s=TIMEOUT_S, max_parallel=2))
    assert [run.statuses for run in runs] == [["timeout"] * 3, ["error"] * 3, ["syntax"] * 3, ["done"] * 3]
    assert [run.passed for run in runs][3] == [True, False, False]


def test_nothing_outside_work_is_written_and_no_connection_reaches_the_host(tmp_path):
    token = uuid.uuid4().hex
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    targets = [tmp_path / f"pwned-{token}", REPO / f"pwned-{token}", Path("/root") / f"pwned-{token}"]
    write = "\n".join(f"try:\n    open({str(path)!r}, 'w').write('x')\n    print('wrote')\nexcept OSError:\n    pass"
                      for path in targets)
    connect = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'{token}')\n"
               "print('wrote')")
    expected = {"inputs": [""], "outputs": ["wrote"]}
    scores = code(["p", "p"], [write, connect], [expected, expected], timeout_s=2)
    server.setblocking(False)
    with pytest.raises(BlockingIOError):  # a connection that reached the host would wait in the backlog
        server.accept()
    server.close()
    assert [row["score"] for row in scores] == [0.0, 0.0]
    assert not any(path.exists() for path in targets)


def test_the_expected_outputs_never_enter_the_sandbox():
    suite = parse_tests({"inputs": ["INPUT-abc"], "outputs": ["SECRET-ANSWER-123"]}, 0)
    program = _program("", "print(1)", suite, CodeLimits())
    assert "INPUT-abc" in program and "SECRET-ANSWER-123" not in program
    call = parse_tests({"fn_name": "f", "inputs": [[1]], "outputs": ["HIDDEN-VALUE"]}, 0)
    assert "HIDDEN-VALUE" not in _program("", "def f(x): return x", call, CodeLimits())


@pytest.mark.parametrize("truth, words", [
    ('{"inputs": ["1"], "outputs": ', "is not valid JSON"),
    ({"inputs": ["1", "2"], "outputs": ["1"]}, "2 inputs and 1 outputs"),
    ({"inputs": [], "outputs": []}, "0 inputs and 0 outputs"),
    ({"input": ["1"], "output": ["1"]}, "no 'inputs' and 'outputs' lists"),
    ({"inputs": ["1"], "outputs": ["1"], "fn_name": "not a name"}, "not a Python name"),
    ("assert f(1) ==", "syntax error"),
    ("   ", "is empty"),
    (None, "is a NoneType"),
    ([], "with no tests"),
])
def test_a_malformed_ground_truth_is_an_error_naming_the_row_and_column(truth, words):
    with pytest.raises(RewardSettingError) as caught:
        code(["p", "p"], ["print(1)", "print(1)"], [ADD, truth])
    assert "the ground_truth column of sample 1" in str(caught.value) and words in str(caught.value)


@pytest.mark.parametrize("kwargs, key", [
    ({"timeout": 5}, "roles.reward.function_kwargs.timeout: code has no setting 'timeout'"),
    ({"timeout_s": 0}, "roles.reward.function_kwargs.timeout_s: must be a number of at least 0.05"),
    ({"memory_mib": "lots"}, "roles.reward.function_kwargs.memory_mib: must be an integer"),
    ({"max_parallel": 0}, "roles.reward.function_kwargs.max_parallel: must be an integer of at least 1"),
    ({"allow_unconfined": "yes"}, "roles.reward.function_kwargs.allow_unconfined: must be true or false"),
])
def test_a_bad_setting_is_an_error_naming_its_key(kwargs, key):
    with pytest.raises(RewardSettingError, match=key.replace(".", r"\.").replace("(", r"\(")):
        code(["p"], ["print(1)"], [ADD], **kwargs)


def test_a_host_that_refuses_the_boundary_names_allow_unconfined_and_the_opt_out_runs_the_tests(monkeypatch):
    monkeypatch.setattr(python_sandbox, "_REFUSALS", {True: "unshare: Operation not permitted"})
    with pytest.raises(RewardSettingError) as caught:
        code(["p"], [FENCED_ADD], [ADD])
    assert "roles.reward.function_kwargs.allow_unconfined: true" in str(caught.value)
    assert "(unshare: Operation not permitted)" in str(caught.value)
    assert code(["p", "p"], [FENCED_ADD, "print(0)"], [ADD, ADD], allow_unconfined=True) == [
        {"score": 1.0, "code_compiled": 1.0, "code_timeouts": 0.0}, {"score": 0.0, "code_compiled": 1.0, "code_timeouts": 0.0}]


def test_the_program_is_the_last_python_block_else_the_last_block_else_the_response():
    assert extract_code("```py\nx = 1\n```\n```\nplain\n```\n```python\ny = 2\n```\ntext") == "y = 2\n"
    assert extract_code("```\nq = 1\n```") == "q = 1\n"
    assert extract_code(" print(1)") == "print(1)"
    assert extract_code("cut off ```python\nprint(") == "print("


def _code_recipe(tmp_path: Path, kwargs: str) -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((REPO / "recipes" / "quickstart.yaml").read_text().replace(
        "function: rlhfctl.tasks.digits:score", f"function: rlhfctl.rewards:code\n    function_kwargs: {kwargs}"))
    return recipe


def test_validate_exits_2_naming_an_unknown_setting_and_the_refused_sandbox(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rlhfctl.cli import app

    monkeypatch.setattr(python_sandbox, "_REFUSALS", {True: "unshare: Operation not permitted"})
    result = CliRunner().invoke(app, ["validate", str(_code_recipe(tmp_path, "{timeout: 3}"))], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "roles.reward.function_kwargs.timeout: code has no setting 'timeout'" in result.output
    assert "roles.reward.function_kwargs.allow_unconfined: true" in result.output
    assert "Traceback" not in result.output


def test_validate_passes_the_opt_out_with_a_warning(tmp_path, monkeypatch):
    from rlhfctl.recipe import load_recipe
    from rlhfctl.recipe.validate import validate_recipe

    monkeypatch.setattr(python_sandbox, "_REFUSALS", {True: "unshare: Operation not permitted"})
    report = validate_recipe(load_recipe(_code_recipe(tmp_path, "{allow_unconfined: true, timeout_s: 2}")))
    assert report.ok, [issue.message for issue in report.errors]
    assert any(issue.key_path == "roles.reward.function_kwargs.allow_unconfined" and "resource limits only"
               in issue.message for issue in report.issues)


def test_the_package_exports_code():
    assert rlhfctl.rewards.code is code and code.__module__ == "rlhfctl.rewards.code_execution"


def test_the_fork_bomb_left_nothing_running(table_scores):
    assert _children() - _CHILDREN_BEFORE == set()


_CHILDREN_BEFORE: set[str] = set()


def _children() -> set[str]:
    """The pids of this test process's children."""
    return {pid for pid in os.listdir("/proc") if pid.isdigit() and _parent(pid) == os.getpid()}


def _parent(pid: str) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
