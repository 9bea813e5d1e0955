"""What the python tool's namespace boundary stops: each attack of issue 36 as real code in a real sandbox.

The tests run as whoever runs pytest (root in CI); ``test_the_boundary_holds_for_an_unprivileged_caller``
repeats the process, file and network attacks as uid 65534 when pytest runs as root.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from rlhfctl.agents.tool import ToolResult
from rlhfctl.agents.tools import PythonSandbox, python_sandbox
from tests.agents.survivors import NAME_ME, named, new_token, wait_for_named

pytestmark = pytest.mark.skipif(
    bool(python_sandbox.boundary_refusal()),
    reason=f"this kernel refuses the sandbox's namespaces ({python_sandbox.boundary_refusal()}): the boundary cannot be tested here",
)

REPO = Path(__file__).resolve().parents[2]


def run(code: str, **config: object) -> ToolResult:
    return asyncio.run(PythonSandbox(**config).execute("t", {"code": textwrap.dedent(code)}))


def lines(result: ToolResult) -> list[str]:
    assert result.metrics["confined"] == 1.0
    return result.text.splitlines()


def test_the_code_sees_neither_the_parents_environment_nor_other_processes(monkeypatch) -> None:
    monkeypatch.setenv("RLHFCTL_TEST_SECRET", "s3cret-value")
    code = f"""
        import os
        print(sorted(p for p in os.listdir("/proc") if p.isdigit()))
        for pid in ("{os.getpid()}", "{os.getppid()}", "1"):
            try:
                print(pid, open(f"/proc/{{pid}}/environ").read())
            except OSError as error:
                print(pid, type(error).__name__)
        print("RLHFCTL_TEST_SECRET" in os.environ)
    """
    result = run(code)
    assert "s3cret" not in result.text
    assert lines(result) == ["['1', '2']", f"{os.getpid()} FileNotFoundError", f"{os.getppid()} FileNotFoundError",
                             "1 PermissionError", "False"]


def test_a_20_gb_allocation_is_a_memory_error() -> None:
    result = run("x = bytearray(20 * 1024 ** 3)\nprint('allocated')")
    assert result.text.startswith("error: exit status 1")
    assert "MemoryError" in result.text and "allocated" not in result.text


def test_an_endless_loop_is_stopped_by_the_timeout_and_the_cpu_limit() -> None:
    started = time.monotonic()
    assert run("while True: pass", timeout_s=1, cpu_s=30).text == "error: timed out after 1 s"
    assert time.monotonic() - started < 5.0
    assert run("while True: pass", timeout_s=10, cpu_s=1).text == "error: killed by signal SIGXCPU (CPU time limit)"


def test_a_socket_to_the_hosts_loopback_is_refused() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        result = run(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {server.getsockname()[1]}), timeout=2)
                print("connected")
            except OSError as error:
                print(type(error).__name__, error.errno)
        """)
    finally:
        server.close()
    assert lines(result) == ["OSError 101"]  # ENETUNREACH: the namespace's loopback is down
    assert result.metrics["network_isolated"] == 1.0


def test_forking_200_processes_stops_at_the_process_cap_even_for_root() -> None:
    code = """
        import os, time
        forked = 0
        try:
            for _ in range(200):
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                forked += 1
        except OSError as error:
            print(forked, error.strerror)
    """
    result = run(code, max_processes=64)
    assert lines(result) == ["62 Resource temporarily unavailable"]  # 64 with init and the code's own process
    assert result.metrics["ok"] == 1.0


def test_a_setsid_child_dies_with_the_call_and_stays_dead() -> None:
    token = new_token()
    code = f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            {NAME_ME.format(token=token)}
            time.sleep(3)
            open("/work/late", "w").write("still alive")
            {NAME_ME.format(token=token + "w")}
            time.sleep(60)
            os._exit(0)
        time.sleep(1)
        print("parent done")
    """

    async def call_and_watch() -> tuple[ToolResult, list[int]]:
        call = asyncio.create_task(PythonSandbox().execute("t", {"code": textwrap.dedent(code)}))
        seen = await asyncio.to_thread(wait_for_named, token)
        return await call, seen

    result, seen = asyncio.run(call_and_watch())
    assert result.text == "parent done\n"
    assert len(seen) == 1, "the setsid child never showed up: the survivor check would prove nothing"
    assert named(token) == []
    time.sleep(3.5)  # past the moment it would have written its file and renamed itself
    assert named(token) == [] and named(token + "w") == []


def test_a_double_forked_orphan_dies_with_the_call() -> None:
    token = new_token()
    code = f"""
        import os, time
        if os.fork() == 0:
            if os.fork() == 0:
                {NAME_ME.format(token=token)}
                time.sleep(60)
            os._exit(0)
        os.wait()
        time.sleep(0.5)  # the orphan renames itself
        print(sorted(open(f"/proc/{{p}}/comm").read().strip() for p in os.listdir("/proc") if p.isdigit()))
    """
    result = run(code)
    assert token in result.text  # the orphan ran, reparented to our init ...
    assert named(token) == []  # ... and is gone once the call returned


def test_nothing_outside_the_work_directory_is_writable() -> None:
    shown = Path(tempfile.mkdtemp(dir="/var/tmp" if os.path.isdir("/var/tmp") else None)) / "shown"
    shown.mkdir(mode=0o777)
    (shown / "data.txt").write_text("test case 1")
    os.chmod(shown, 0o777)  # writable by anyone on the host: only the read-only mount stops the code
    os.chmod(shown / "data.txt", 0o666)
    code = f"""
        for path in ("/x", "/etc/x", "/usr/x", "/tmp/x", "/dev/shm/x", "/work/x", "{shown}/x", "{shown}/data.txt",
                     "{sys.base_prefix}/x"):
            try:
                open(path, "a").write("pwned")
                print(path, "written")
            except OSError as error:
                print(path, error.strerror)
        print(open("{shown}/data.txt").read())
    """
    result = run(code, readonly_paths=[str(shown)])
    assert lines(result) == [
        "/x Read-only file system", "/etc/x Read-only file system", "/usr/x Read-only file system",
        "/tmp/x written", "/dev/shm/x written", "/work/x written",  # one tmpfs, gone with the call
        f"{shown}/x Read-only file system", f"{shown}/data.txt Read-only file system",
        f"{sys.base_prefix}/x Read-only file system", "test case 1",
    ]
    assert sorted(p.name for p in shown.iterdir()) == ["data.txt"]
    assert (shown / "data.txt").read_text() == "test case 1"
    assert not Path("/tmp/x").exists()
    shutil.rmtree(shown.parent)


def test_a_readonly_path_under_tmp_leaves_tmp_read_only(tmp_path) -> None:
    (tmp_path / "data.txt").write_text("shown")
    os.chmod(tmp_path, 0o755)
    code = f"print(open('{tmp_path}/data.txt').read())\ntry:\n    open('/tmp/x', 'w')\nexcept OSError as e:\n    print(e.strerror)"
    assert lines(run(code, readonly_paths=[str(tmp_path)])) == ["shown", "Read-only file system"]


def test_secrets_and_the_projects_files_are_not_visible() -> None:
    project_file = REPO / "pyproject.toml"
    assert project_file.exists()
    code = f"""
        import os
        for path in ("/etc/shadow", "{project_file}", "{REPO}", "{Path.home()}/.ssh", "/etc/hostname"):
            try:
                os.stat(path)
                print(path, "visible")
            except OSError as error:
                print(path, error.strerror)
        print(sorted(os.listdir("/")))
    """
    result = run(code)
    assert lines(result)[:5] == [f"{path} No such file or directory" for path in
                                 ("/etc/shadow", project_file, REPO, f"{Path.home()}/.ssh", "/etc/hostname")]
    shown_top = set(eval(lines(result)[5]))  # noqa: S307 - our own printed list
    assert {"work", "tmp", "proc", "dev", "etc", "usr"} <= shown_top
    assert not shown_top & {"home", "var", "run", "opt", "mnt", "srv", "boot", "sys"} - {Path(sys.base_prefix).parts[1]}


def test_site_packages_shows_the_installed_packages_but_not_the_project() -> None:
    code = """
        import pluggy
        print("pluggy", pluggy.__name__)
        try:
            import rlhfctl
        except ImportError as error:
            print(type(error).__name__)
    """
    assert lines(run(code, site_packages=True)) == ["pluggy pluggy", "ModuleNotFoundError"]
    assert "No module named 'pluggy'" in run("import pluggy").text


def test_ptrace_mount_and_a_nested_namespace_are_denied() -> None:
    code = f"""
        import ctypes, errno
        libc = ctypes.CDLL(None, use_errno=True)
        def call(result):
            return "ok" if result == 0 else errno.errorcode[ctypes.get_errno()]
        print("attach outside", call(libc.ptrace(16, {os.getpid()}, 0, 0)))  # PTRACE_ATTACH to the test process
        print("attach init", call(libc.ptrace(16, 1, 0, 0)))
        print("mount", call(libc.mount(b"tmpfs", b"/work", b"tmpfs", 0, None)))
        print("remount rw", call(libc.mount(None, b"/usr", None, 32 | 4096, None)))
        print("umount", call(libc.umount2(b"/usr", 2)))
        print("new user namespace", call(libc.unshare(0x10000000)))
    """
    assert lines(run(code)) == ["attach outside ESRCH", "attach init EPERM", "mount EPERM", "remount rw EPERM",
                                "umount EPERM", "new user namespace ENOSPC"]


def test_a_limit_cannot_be_raised_above_its_hard_cap() -> None:
    code = """
        import resource
        for name in ("RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CPU"):
            limit = getattr(resource, name)
            soft, hard = resource.getrlimit(limit)
            try:
                resource.setrlimit(limit, (hard + 1, hard + 1))
                print(name, "raised")
            except ValueError as error:
                print(name, error)
    """
    assert lines(run(code)) == [f"{name} not allowed to raise maximum limit"
                                for name in ("RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CPU")]


def test_filling_the_disk_stops_at_the_file_cap_and_the_work_size() -> None:
    code = """
        import os
        chunk = b"x" * 1024 ** 2
        try:
            open("big", "wb").write(chunk * 9)
        except OSError as error:
            print("one file:", error.strerror, os.path.getsize("big") // 1024 ** 2)
        os.remove("big")
        written = 0
        try:
            for i in range(100):
                with open(f"f{i}", "wb") as handle:
                    for _ in range(4):
                        handle.write(chunk)
                        written += 1
        except OSError as error:
            print("many files:", error.strerror, written)
    """
    result = run(code, max_file_mb=8, work_mb=20)
    assert lines(result)[0] == "one file: File too large 8"
    head, written = lines(result)[1].rsplit(" ", 1)
    assert head == "many files: No space left on device"
    assert 16 <= int(written) <= 20


def test_a_huge_output_is_cut_and_the_call_ends() -> None:
    started = time.monotonic()
    result = run("import sys\nfor _ in range(200): sys.stdout.write('y' * 1024 ** 2)", max_output_chars=50)
    assert result.text == "y" * 50 + python_sandbox.TRUNCATED
    assert result.metrics["truncated"] == 1.0 and result.metrics["ok"] == 1.0
    assert time.monotonic() - started < 30.0


def test_a_zip_bomb_stops_at_the_file_size_cap() -> None:
    code = """
        import os, zipfile
        with zipfile.ZipFile("bomb.zip", "w", zipfile.ZIP_DEFLATED) as bomb:
            with bomb.open("zeros", "w", force_zip64=True) as member:
                for _ in range(256):
                    member.write(bytes(1024 ** 2))
        print("zip bytes under 1 MB:", os.path.getsize("bomb.zip") < 1024 ** 2)
        try:
            zipfile.ZipFile("bomb.zip").extractall("out")
            print("expanded")
        except OSError as error:
            print(error.strerror, os.path.getsize("out/zeros") // 1024 ** 2)
    """
    assert lines(run(code, max_file_mb=16)) == ["zip bytes under 1 MB: True", "File too large 16"]


def test_a_readonly_path_in_a_root_only_folder_is_shown(tmp_path) -> None:
    """Only the path itself must be readable by the code's user: the folders above it are made anew inside."""
    private = Path(tempfile.mkdtemp(dir=tmp_path))
    os.chmod(tmp_path, 0o700)  # nobody could walk to it on the host
    os.chmod(private, 0o755)
    (private / "tests.py").write_text("assert 1 + 1 == 2\n")
    result = run(f"print(open('{private}/tests.py').read(), end='')", readonly_paths=[str(private)])
    assert result.text == "assert 1 + 1 == 2\n"


def test_a_missing_readonly_path_is_an_error_before_any_code_runs(tmp_path) -> None:
    result = run("print('ran')", readonly_paths=[str(tmp_path / "missing")])
    assert result.text == f"error: readonly_paths entry '{tmp_path / 'missing'}' cannot be shown: No such file or directory"
    assert result.metrics["ok"] == 0.0
    with pytest.raises(ValueError, match="readonly_paths must be a list of absolute paths"):
        PythonSandbox(readonly_paths=["relative/dir"])
    for path in ("/", "/proc/1", "/work/x", "/dev"):
        with pytest.raises(ValueError, match=f"readonly_paths cannot show '{path}'"):
            PythonSandbox(readonly_paths=[path])


def test_a_single_file_can_be_shown_read_only(tmp_path) -> None:
    tests = tmp_path / "tests.jsonl"
    tests.write_text('{"input": 1}\n')
    os.chmod(tmp_path, 0o755)
    code = f"import os\nprint(open('{tests}').read(), end='')\nprint(sorted(os.listdir('{tmp_path}')))"
    assert lines(run(code, readonly_paths=[str(tests)])) == ['{"input": 1}', "['tests.jsonl']"]


def test_the_launcher_ends_the_call_at_its_deadline_if_the_tool_is_gone() -> None:
    token = new_token()
    status_read, status_write = os.pipe()
    settings = python_sandbox._boundary_settings(status_write, deadline_s=1.0)
    code = f"{NAME_ME.format(token=token)}\nimport time\ntime.sleep(60)"
    started = time.monotonic()
    launcher = subprocess.Popen(python_sandbox.launcher_command(True, settings), stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, pass_fds=(status_write,), cwd="/", start_new_session=True)
    os.close(status_write)
    launcher.stdin.write(code.encode())
    launcher.stdin.close()  # and nobody times the call out: as if the tool had died
    try:
        assert wait_for_named(token), "the code never ran: the deadline check would prove nothing"
        assert launcher.wait(timeout=10) == -9
    finally:
        launcher.kill()
        os.close(status_read)
    assert time.monotonic() - started < 5.0
    assert named(token) == []


UNPRIVILEGED_DRIVER = """
import asyncio, json, os, sys
sys.path.insert(0, sys.argv[1])
from rlhfctl.agents.tools import PythonSandbox
results = {}
for name, code in json.loads(sys.argv[2]).items():
    result = asyncio.run(PythonSandbox(max_processes=64).execute("t", {"code": code}))
    results[name] = [result.text, result.metrics["confined"]]
print(json.dumps({"caller": [os.geteuid(), os.getegid(), os.getgroups()], **results}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="pytest already runs unprivileged: every other test is the unprivileged case")
def test_the_boundary_holds_for_an_unprivileged_caller(tmp_path) -> None:
    """As uid 65534: the same launcher, with maps the caller may write itself (its own id, setgroups denied)."""
    interpreter = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if interpreter is None:
        pytest.skip("no python3 in /usr/local/bin, /usr/bin or /bin for uid 65534 to run")
    copy = Path(tempfile.mkdtemp(prefix="rlhfctl-unprivileged-"))
    try:
        shutil.copytree(REPO / "rlhfctl", copy / "rlhfctl", ignore=shutil.ignore_patterns("__pycache__"))
        (copy / "driver.py").write_text(UNPRIVILEGED_DRIVER)
        for folder, _dirs, files in os.walk(copy):
            os.chmod(folder, 0o755)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o644)
        token = new_token()
        attacks = {
            "who": "import os; print(os.getuid(), sorted(p for p in os.listdir('/proc') if p.isdigit()))",
            "fork": "import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
                    "            time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, e.strerror)",
            "setsid": f"import os, time\nif os.fork() == 0:\n    os.setsid(); {NAME_ME.format(token=token)}; time.sleep(60)\n"
                      "time.sleep(0.5); print('left a child')",
            "write": "try:\n    open('/usr/x', 'w')\nexcept OSError as e:\n    print(e.strerror)",
            "shadow": "import os; print(os.path.exists('/etc/shadow'), os.path.exists(%r))" % str(REPO / "pyproject.toml"),
            "net": "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\nexcept OSError as e:\n    print(e.errno)",
        }
        out = subprocess.run(
            [interpreter, "-I", str(copy / "driver.py"), str(copy), json.dumps(attacks)], capture_output=True, text=True,
            timeout=120, cwd=copy, env={"PATH": "/usr/bin:/bin"}, check=False, user=65534, group=65534, extra_groups=[],
        )
        assert out.returncode == 0, out.stderr
        results = json.loads(out.stdout)
        assert results.pop("caller") == [65534, 65534, []]
        assert all(confined == 1.0 for _text, confined in results.values())
        assert results["who"][0] == "65534 ['1', '2']\n"
        assert results["fork"][0] == "61 Resource temporarily unavailable\n"  # the launcher counts: it has our uid
        assert results["setsid"][0] == "left a child\n" and named(token) == []
        assert results["write"][0] == "Read-only file system\n"
        assert results["shadow"][0] == "False False\n"
        assert results["net"][0] == "101\n"
    finally:
        shutil.rmtree(copy, ignore_errors=True)
