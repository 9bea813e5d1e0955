"""rlhfctl.agents.tools.PythonSandbox: real child processes, confined by timeout, rlimits, env, cwd and network.

What the namespace boundary stops (files, processes, ptrace, mounts...) is in test_sandbox_boundary.py; here are
the tool's behaviours, and the unconfined mode of a kernel that refuses the namespaces.
"""

from __future__ import annotations

import ast
import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlhfctl.agents.tool import ToolResult
from rlhfctl.agents.tools import PythonSandbox, python_sandbox, sandbox_child
from tests.agents.survivors import NAME_ME, named, new_token, wait_for_named


def run(code: str, tool: PythonSandbox | None = None, **config: object) -> ToolResult:
    tool = tool or PythonSandbox(**config)
    return asyncio.run(tool.execute("t", {"code": textwrap.dedent(code)}))


@pytest.fixture
def listening_port():
    """A TCP port on 127.0.0.1 that accepts connections, opened by the test process."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


CONNECT = """
    import socket
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
        print("connected")
    except OSError as error:
        print("refused:", error)
"""


@pytest.fixture
def threaded_child(monkeypatch, tmp_path):
    """Start the launcher (and the child) behind a wrapper that starts a thread first, so the kernel refuses
    unshare (EINVAL): the path of an OS without user namespaces, produced for real on this one, probe included.
    """
    wrapper = tmp_path / "threaded.py"
    wrapper.write_text(
        "import runpy, sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "if sys.argv[1] == '-c':\n"
        "    sys.argv = sys.argv[2:]\n"
        "    exec(sys.argv[0], {'__name__': '__main__'})\n"
        "else:\n"
        "    sys.argv = sys.argv[1:]\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    command = python_sandbox.launcher_command

    def wrapped(*args, **kwargs) -> list[str]:
        original = command(*args, **kwargs)
        start = next(i for i, part in enumerate(original) if i > 0 and not part.startswith("-") or part == "-c")
        return [*original[:start], str(wrapper), *original[start:]]

    monkeypatch.setattr(python_sandbox, "launcher_command", wrapped)
    monkeypatch.setattr(python_sandbox, "_REFUSALS", {})


pytestmark = pytest.mark.skipif(
    bool(python_sandbox.boundary_refusal()),
    reason=f"this kernel refuses the sandbox's namespaces ({python_sandbox.boundary_refusal()}): the boundary cannot be tested here",
)


def test_prints_output() -> None:
    result = run("print(6 * 7)\nimport sys; print('to stderr', file=sys.stderr)")
    assert result.text == "42\nto stderr\n"
    assert result.metrics["ok"] == 1.0
    assert result.metrics["timed_out"] == 0.0


def test_no_output_is_said_so() -> None:
    assert run("x = 1").text == "(no output)"


def test_an_exception_is_exit_status_1_with_the_traceback() -> None:
    result = run("print('before')\nraise ValueError('boom')")
    assert result.text.startswith("error: exit status 1\nbefore\n")
    assert 'File "<code>", line 2' in result.text
    assert result.text.rstrip().endswith("ValueError: boom")
    assert "sandbox_child" not in result.text
    assert result.metrics["ok"] == 0.0


def test_syntax_error_and_sys_exit_are_reported() -> None:
    assert "SyntaxError" in run("def f(:").text
    assert run("import sys; sys.exit(3)").text == "error: exit status 3"


def test_the_code_ends_as_a_script_would_threads_joined_atexit_run() -> None:
    code = """
        import atexit, threading, time
        atexit.register(print, "atexit ran")
        threading.Thread(target=lambda: (time.sleep(0.3), print("thread done", flush=True))).start()
        print("main done")
    """
    assert run(code).text == "main done\nthread done\natexit ran\n"
    assert run("import sys; sys.exit('bad input')").text == "error: exit status 1\nbad input\n"


def test_non_string_code_is_an_error_not_an_exception() -> None:
    tool = PythonSandbox()
    result = asyncio.run(tool.execute("t", {"code": 12}))
    assert result.text == "error: 'code' must be a string"


def test_timeout_kills_a_busy_loop() -> None:
    started = time.monotonic()
    result = run("print('started', flush=True)\nwhile True: pass", timeout_s=1)
    assert time.monotonic() - started < 3.0
    assert result.text == "error: timed out after 1 s\nstarted\n"
    assert result.metrics["timed_out"] == 1.0


def test_timeout_kills_the_whole_process_group() -> None:
    token = new_token()
    code = f"""
        import os, time
        pid = os.fork()
        if pid == 0:
            {NAME_ME.format(token=token)}
            time.sleep(60)
            os._exit(0)
        print(pid, flush=True)
        while True:
            pass
    """

    async def call_and_watch() -> tuple[ToolResult, list[int]]:
        call = asyncio.create_task(PythonSandbox(timeout_s=2).execute("t", {"code": textwrap.dedent(code)}))
        seen = await asyncio.to_thread(wait_for_named, token)
        return await call, seen

    result, seen = asyncio.run(call_and_watch())
    assert result.text.startswith("error: timed out after 2 s\n")
    assert len(seen) == 1, "the forked sleeper never showed up: the survivor check would prove nothing"
    assert named(token) == [], "the forked sleeper outlived the timeout"


def test_leftover_children_are_killed_when_the_code_exits() -> None:
    token = new_token()
    result = run(f"import subprocess; subprocess.Popen(['python3', '-c', {NAME_ME.format(token=token)!r} + "
                 f"'; import time; time.sleep(60)']); import time; time.sleep(1); print('done')", timeout_s=5)
    assert result.text == "done\n"
    assert named(token) == []


def test_cpu_limit_stops_a_busy_loop_before_the_wall_clock_timeout() -> None:
    result = run("while True: pass", timeout_s=10, cpu_s=1)
    assert result.text == "error: killed by signal SIGXCPU (CPU time limit)"
    assert result.metrics["timed_out"] == 0.0


def test_memory_limit_stops_a_big_allocation() -> None:
    result = run("x = bytearray(1024 ** 3)\nprint('allocated')", memory_mb=256)
    assert result.text.startswith("error: exit status 1")
    assert "MemoryError" in result.text
    assert "allocated" not in result.text
    assert run("x = bytearray(64 * 1024 ** 2)\nprint('allocated')", memory_mb=256).text == "allocated\n"


def test_file_size_limit_stops_a_big_write() -> None:
    result = run("open('big', 'wb').write(b'x' * 2 * 1024 ** 2)", max_file_mb=1)
    assert "File too large" in result.text


def test_environment_is_scrubbed(monkeypatch) -> None:
    monkeypatch.setenv("RLHFCTL_TEST_SECRET", "s3cret-value")
    result = run("import os; print(sorted(os.environ)); print(os.environ.get('RLHFCTL_TEST_SECRET'))")
    assert "s3cret" not in result.text
    assert "RLHFCTL_TEST_SECRET" not in result.text
    names = ast.literal_eval(result.text.splitlines()[0])
    assert set(names) <= {"PATH", "LANG", "HOME", "TMPDIR", "PYTHONNOUSERSITE", "PYTHONDONTWRITEBYTECODE",
                          "PYTHONUNBUFFERED"}


def test_child_sees_the_standard_library_only() -> None:
    assert "ModuleNotFoundError: No module named 'rlhfctl'" in run("import rlhfctl").text


CHMOD_CODE = """
        import os
        print(os.getcwd())
        print(os.listdir("."))
        os.makedirs("sub/locked")
        open("sub/locked/file", "w").write("data")
        os.chmod("sub/locked", 0)
        os.chmod("sub", 0)
    """


def test_cwd_is_an_empty_work_tmpfs_that_leaves_nothing_on_the_host(tmp_path) -> None:
    result = run(CHMOD_CODE, work_root=str(tmp_path))
    assert result.metrics["ok"] == 1.0, result.text
    assert result.text.splitlines() == ["/work", "[]"]
    assert list(tmp_path.iterdir()) == []


def test_unconfined_cwd_is_an_empty_temp_dir_removed_afterwards(threaded_child, tmp_path) -> None:
    tmp_path = tmp_path / "work_root"  # the fixture's wrapper script is in tmp_path itself
    tmp_path.mkdir()
    result = run(CHMOD_CODE, work_root=str(tmp_path), allow_unconfined=True)
    assert result.metrics["ok"] == 1.0, result.text
    cwd, listing = result.text.splitlines()
    assert Path(cwd).parent == tmp_path
    assert listing == "[]"
    assert not Path(cwd).exists()
    assert list(tmp_path.iterdir()) == []


def test_network_namespace_blocks_loopback(listening_port) -> None:
    result = run(CONNECT.format(port=listening_port))
    assert result.metrics["network_isolated"] == 1.0
    assert result.metrics["confined"] == 1.0
    assert result.text.startswith("refused:"), result.text


def test_without_isolation_the_metrics_say_so(listening_port) -> None:
    result = run(CONNECT.format(port=listening_port), isolate_network=False)
    assert result.metrics["network_isolated"] == 0.0
    assert result.text == "connected\n"


def test_an_os_that_refuses_the_namespaces_refuses_to_build_the_tool_naming_the_key(threaded_child) -> None:
    with pytest.raises(python_sandbox.SandboxUnavailable) as refused:
        PythonSandbox()
    message = str(refused.value)
    assert "cannot be built on this host (unshare: Invalid argument)" in message
    assert "rollout.multi_turn.tools[i].config.allow_unconfined: true" in message


def test_a_call_the_kernel_refuses_after_the_probe_said_yes(threaded_child, monkeypatch) -> None:
    """The probe passed (as if the host changed since), the calls are refused for real: never run unconfined
    unless allowed, not even on a later call."""
    monkeypatch.setattr(python_sandbox, "_REFUSALS", {True: ""})
    strict = PythonSandbox()
    for _ in range(2):
        result = run("print('ran')", tool=strict)
        assert result.text.startswith("error: the python tool's sandbox cannot be built on this host (unshare:")
        assert "allow_unconfined: true" in result.text and result.metrics["confined"] == 0.0
    assert strict.confined
    lenient = PythonSandbox(allow_unconfined=True)
    assert run("print('ran')", tool=lenient).text == "ran\n"
    assert not lenient.confined


def test_a_launcher_that_crashes_is_reported_and_probed_again(monkeypatch) -> None:
    monkeypatch.setattr(python_sandbox, "_REFUSALS", {})
    monkeypatch.setattr(python_sandbox, "launcher_command",
                        lambda *args, **kwargs: [sys.executable, "-c", "raise SystemExit('launcher bug')"])
    assert python_sandbox.boundary_refusal() == "the launcher ended with status 1 and no report: launcher bug"
    assert python_sandbox._REFUSALS == {}  # not a verdict on the kernel: the next tool probes again


def test_allow_unconfined_runs_the_code_as_before_where_the_os_refuses(threaded_child, listening_port, caplog) -> None:
    with caplog.at_level("WARNING", logger=python_sandbox.__name__):
        result = run(CONNECT.format(port=listening_port), allow_unconfined=True)
    assert result.metrics["confined"] == 0.0
    assert result.metrics["network_isolated"] == 0.0
    assert result.metrics["ok"] == 1.0
    assert result.text == "connected\n"
    assert "running without the sandbox's boundary, as allow_unconfined is set: unshare: Invalid argument" in caplog.text
    assert "no network namespace (unshare failed" in caplog.text


def test_required_isolation_refuses_to_run_where_the_os_refuses(threaded_child) -> None:
    result = run("print('ran')", require_network_isolation=True, allow_unconfined=True)
    assert result.text.startswith("error: network isolation is required but unavailable here (unshare failed")
    assert "ran" not in result.text
    assert result.metrics["ok"] == 0.0


def test_output_is_truncated_with_a_marker() -> None:
    result = run("print('x' * 100_000)", max_output_chars=100)
    assert result.text == "x" * 100 + python_sandbox.TRUNCATED
    assert result.metrics["truncated"] == 1.0


def test_concurrent_calls_overlap() -> None:
    tool = PythonSandbox()

    async def eight() -> list[ToolResult]:
        calls = [tool.execute(f"t{i}", {"code": f"import time; time.sleep(0.5); print({i})"}) for i in range(8)]
        return await asyncio.gather(*calls)

    started = time.monotonic()
    results = asyncio.run(eight())
    assert time.monotonic() - started < 3.0  # one after another: over 4 s
    assert [result.text for result in results] == [f"{i}\n" for i in range(8)]


def test_release_kills_a_running_call_and_removes_its_dir(tmp_path) -> None:
    tool = PythonSandbox(timeout_s=30, work_root=str(tmp_path))

    async def release_midway() -> ToolResult:
        call = asyncio.create_task(tool.execute("t", {"code": "print('up', flush=True)\nimport time; time.sleep(30)"}))
        while not tool._live.get("t"):
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        await tool.release("t")
        return await asyncio.wait_for(call, timeout=5)

    started = time.monotonic()
    result = asyncio.run(release_midway())
    assert time.monotonic() - started < 5.0
    assert result.text.startswith("error: killed by signal SIGKILL")
    assert list(tmp_path.iterdir()) == []
    assert tool._live == {}


def test_the_child_reports_why_unshare_failed() -> None:
    """The refusal branch of the child itself: a threaded process cannot enter a new user namespace."""
    code = (
        "import sys, threading, time; sys.path.insert(0, sys.argv[1]); import sandbox_child\n"
        "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
        "print(sandbox_child.enter_network_namespace())\n"
    )
    folder = os.path.dirname(sandbox_child.__file__)
    out = subprocess.run([sys.executable, "-I", "-c", code, folder], capture_output=True, text=True, timeout=10, check=False)
    assert out.stdout.startswith("unshare failed:"), out.stdout + out.stderr


def test_an_unknown_config_key_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(TypeError, match=r"unknown config keys \['timeout'\].*timeout_s"):
        PythonSandbox(timeout=3)
