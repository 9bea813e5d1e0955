"""The bundled ``python`` tool: run the model's code inside a boundary of Linux namespaces, without blocking the loop.

Each call starts the launcher, ``python -I -S -u -c "import sandbox_boundary; ..."`` (isolated mode: no
site-packages, no ``PYTHON*`` variables), in its own process group with a scrubbed environment. It builds new user, mount, PID, network, IPC and UTS namespaces and runs the code there as an unprivileged
user with no capabilities, in a read-only root with a writable tmpfs at ``/work``, under resource limits
(:mod:`rlhfctl.agents.tools.sandbox_boundary`). When the call ends, however it ends, every process it
started is dead. The parent enforces the wall-clock timeout and caps the captured output.

Where the kernel refuses the namespaces, building the tool fails with a message naming
``allow_unconfined``; set true, the calls run as before the boundary existed
(:mod:`rlhfctl.agents.tools.sandbox_child`: a child process with resource limits and a network namespace
where allowed). docs/security.md states what the boundary stops and what it does not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import marshal
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rlhfctl.agents.tool import Tool, ToolResult
import rlhfctl.agents.tools.sandbox_boundary as sandbox_boundary
import rlhfctl.agents.tools.sandbox_child as sandbox_child

__all__ = ["PythonSandbox", "SandboxUnavailable", "boundary_refusal", "refusal_message", "run_programs"]

logger = logging.getLogger(__name__)

TRUNCATED = "\n...[truncated]"
_MIB = 1024 * 1024
_DRAIN_AFTER_EXIT_S = 1.0
"""How long output is still read after the process group is killed (a detached grandchild may hold the pipe)."""
_STOP_GRACE_S = 3.0
"""How long the launcher has, after SIGTERM, to kill the namespace and wait for it to empty (then: SIGKILL)."""
_DEADLINE_AFTER_TIMEOUT_S = 10.0
"""The launcher ends its call this long after ``timeout_s`` by itself, should the tool be gone by then."""


class SandboxUnavailable(RuntimeError):
    """The kernel refuses the namespaces the boundary needs, and ``allow_unconfined`` is not set."""


def refusal_message(why: str, tool_key: str = "rollout.multi_turn.tools[i]") -> str:
    """What to tell a user whose host refuses the boundary: the kernel's reason and the key that opts out."""
    return (
        f"the python tool's sandbox cannot be built on this host ({why}): the kernel refuses the user, mount and "
        f"PID namespaces it needs. Allow them (in a container: a seccomp profile that permits unshare and mount), "
        f"or set {tool_key}.config.allow_unconfined: true to run the code with resource limits only, without the "
        f"boundary (docs/security.md)"
    )


_REFUSALS: dict[bool, str] = {}


def boundary_refusal(isolate_network: bool = True) -> str:
    """'' when this host lets the tool build its boundary, else the kernel's reason; probed once per process
    by running an empty program through the real launcher (a launcher that could not run is not remembered)."""
    if isolate_network in _REFUSALS:
        return _REFUSALS[isolate_network]
    status_read, status_write = os.pipe()
    settings = _boundary_settings(status_write, isolate_network=isolate_network)
    try:
        probe = subprocess.run(launcher_command(True, settings), input=b"", capture_output=True, timeout=60,
                               pass_fds=(status_write,), env=_scrubbed_env("/work"), cwd="/", check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"the launcher did not run: {error}"
    finally:
        os.close(status_write)
        status = _read_status(status_read)
        os.close(status_read)
    if status == "boundary=1":
        _REFUSALS[isolate_network] = ""
    elif status.startswith("boundary=0"):
        _REFUSALS[isolate_network] = status[11:] or "no reason given"
    else:  # a crash, not a refusal: say what it printed
        tail = probe.stderr.decode("utf-8", errors="replace").strip().splitlines()[-1:] or [""]
        return f"the launcher ended with status {probe.returncode} and no report: {tail[0]}"
    return _REFUSALS[isolate_network]


def launcher_command(confined: bool, settings: Mapping[str, Any], site_packages: bool = False) -> list[str]:
    """The command that runs one call: the boundary's launcher, or (unconfined) today's child script.

    The launcher is imported, not run as a script, so its cached bytecode is used: 5 ms less per call.
    """
    flags = ["-I", "-u", "-B"] + ([] if site_packages else ["-S"])
    encoded = marshal.dumps(dict(settings)).hex()
    if not confined:
        return [sys.executable, *flags, sandbox_child.__file__, encoded]
    folder = os.path.dirname(os.path.abspath(sandbox_boundary.__file__))
    bootstrap = (f"import sys; sys.path.insert(0, {folder!r}); import sandbox_boundary; del sys.path[0]; "
                 "sandbox_boundary.main()")
    return [sys.executable, *flags, "-c", bootstrap, encoded]


def _boundary_settings(status_fd: int, **overrides: Any) -> dict[str, Any]:
    """The launcher's settings at the tool's defaults, for the probe."""
    defaults = PythonSandbox.defaults
    settings = {"status_fd": status_fd, "cpu_s": 5, "memory_bytes": int(defaults["memory_mb"]) * _MIB,
                "file_bytes": int(defaults["max_file_mb"]) * _MIB, "max_processes": int(defaults["max_processes"]),
                "isolate_network": True, "readonly_paths": [], "site_packages": False,
                "work_bytes": int(defaults["work_mb"]) * _MIB, "deadline_s": 60.0}
    settings.update(overrides)
    return settings


class _Child(asyncio.SubprocessProtocol):
    """One live child: its exit and the end of its output as futures, and the output read so far.

    asyncio's ``Process.wait()`` also waits for the pipes to close, which a grandchild left running
    would hold open; this protocol reports the exit itself, so the timeout and the cleanup do not wait.
    """

    def __init__(self, workdir: str | None, keep_bytes: int, confined: bool) -> None:
        loop = asyncio.get_running_loop()
        self.workdir = workdir
        self.confined = confined
        self.keep_bytes = keep_bytes
        self.output = bytearray()
        self.dropped = False
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.transport = transport

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        room = self.keep_bytes - len(self.output)
        self.output += data[: max(room, 0)]
        self.dropped = self.dropped or len(data) > room

    def process_exited(self) -> None:
        _settle(self.exited)

    def connection_lost(self, exc: Exception | None) -> None:
        _settle(self.exited)
        _settle(self.closed)

    async def stop(self) -> None:
        """End the call now: a confined launcher kills its namespace and exits once it is empty; then SIGKILL."""
        pid = self.transport.get_pid() if self.transport is not None else None
        if self.confined and pid is not None and not self.exited.done():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            await _wait_briefly(self.exited, _STOP_GRACE_S)
        self.kill_group()

    def kill_group(self) -> None:
        """SIGKILL the child's process group (it is the group leader); nothing if it is already gone."""
        if self.transport is None or self.transport.get_pid() is None:
            return
        try:
            os.killpg(self.transport.get_pid(), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class PythonSandbox(Tool):
    """Runs a Python snippet inside the namespace boundary and returns its combined stdout and stderr.

    Config (defaults in :attr:`defaults`): ``timeout_s`` wall clock; ``cpu_s`` CPU seconds;
    ``memory_mb`` address space; ``max_processes`` RLIMIT_NPROC (0 leaves it unset); ``max_file_mb``
    largest file written; ``work_mb`` size of the writable ``/work`` tmpfs; ``readonly_paths`` host
    paths shown read-only at the same place; ``max_output_chars`` text shown; ``max_code_chars`` longest
    program; ``max_concurrent`` children at once; ``isolate_network`` a network namespace (off: the host's
    network); ``site_packages`` let the child import installed packages; ``allow_unconfined`` run without
    the boundary where the kernel refuses it. Unconfined only: ``require_network_isolation`` refuse to run
    where the OS denies a network namespace; ``work_root`` where the temporary directories go.
    """

    name: ClassVar[str] = "python"
    schema: ClassVar[Mapping[str, Any]] = {
        "type": "function",
        "function": {
            "name": "python",
            "description": (
                "Run a Python 3 program and return what it prints (stdout and stderr). Standard library only, "
                "no network, a few seconds of time; print the values you need."
            ),
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The whole program to run."}},
                "required": ["code"],
            },
        },
    }

    defaults: ClassVar[Mapping[str, Any]] = {
        "timeout_s": 5.0,
        "cpu_s": None,  # timeout_s + 1
        "memory_mb": 512,
        "max_processes": 64,
        "max_file_mb": 16,
        "max_output_chars": 2000,
        "max_code_chars": 100_000,
        "max_concurrent": 16,
        "work_mb": 64,
        "readonly_paths": (),
        "isolate_network": True,
        "require_network_isolation": False,
        "site_packages": False,
        "allow_unconfined": False,
        "work_root": None,
    }

    def __init__(self, **config: Any) -> None:
        unknown = sorted(set(config) - set(self.defaults))
        if unknown:
            raise TypeError(f"python tool: unknown config keys {unknown}; the known keys are {sorted(self.defaults)}")
        super().__init__(**config)
        settings = {**self.defaults, **config}
        self.timeout_s = float(settings["timeout_s"])
        self.max_output_chars = int(settings["max_output_chars"])
        self.max_code_chars = int(settings["max_code_chars"])
        self.max_concurrent = int(settings["max_concurrent"])
        self.isolate_network = bool(settings["isolate_network"])
        self.require_network_isolation = bool(settings["require_network_isolation"])
        self.site_packages = bool(settings["site_packages"])
        self.work_root = settings["work_root"]
        self.allow_unconfined = bool(settings["allow_unconfined"])
        self.readonly_paths = _absolute_paths(settings["readonly_paths"])
        self.work_bytes = int(settings["work_mb"]) * _MIB
        cpu_s = settings["cpu_s"]
        self.limits = {
            "cpu_s": int(cpu_s) if cpu_s is not None else int(self.timeout_s) + 1,
            "memory_bytes": int(settings["memory_mb"]) * _MIB,
            "file_bytes": int(settings["max_file_mb"]) * _MIB,
            "max_processes": int(settings["max_processes"]),
        }
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._live: dict[str, set[_Child]] = {}
        self._warned_network = False
        self.refusal = boundary_refusal(self.isolate_network)
        """Why the kernel refuses the boundary here ('' when it does not): then the calls run unconfined."""
        if self.refusal:
            self._refused(self.refusal)

    @property
    def confined(self) -> bool:
        """True when calls run inside the boundary; False only where the kernel refused it and the config allows."""
        return not self.refusal

    def _refused(self, why: str) -> None:
        """Run unconfined from now on, if the config allows; else raise :class:`SandboxUnavailable`."""
        if not self.allow_unconfined:
            raise SandboxUnavailable(refusal_message(why))
        self.refusal = why
        logger.warning("python tool: running without the sandbox's boundary, as allow_unconfined is set: %s", why)

    async def execute(self, instance_id: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run ``arguments["code"]``; the text is its output, or ``error: ...`` with the reason and output."""
        code = arguments.get("code")
        if not isinstance(code, str):
            return ToolResult("error: 'code' must be a string", metrics={"ok": 0.0})
        if len(code) > self.max_code_chars:
            return ToolResult(f"error: code is longer than {self.max_code_chars} characters", metrics={"ok": 0.0})
        async with self._slots_for_this_loop():
            return await self._run(instance_id, code)

    async def release(self, instance_id: str) -> None:
        """Stop any call of this trajectory still running (its whole namespace) and remove its directory."""
        for child in self._live.pop(instance_id, set()):
            await child.stop()
            if child.workdir is not None:
                _remove_tree(child.workdir)

    def _slots_for_this_loop(self) -> asyncio.Semaphore:
        """The bound on concurrent children (a semaphore belongs to one event loop, so one per loop)."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.max_concurrent))
        return self._slots[1]

    async def _run(self, instance_id: str, code: str) -> ToolResult:
        result = await self._run_once(instance_id, code, self.confined)
        if isinstance(result, str):  # the kernel refused the boundary after the probe said yes: opt out, or say so
            try:
                self._refused(result)
            except SandboxUnavailable as error:
                return ToolResult(f"error: {error}", metrics={"ok": 0.0, "confined": 0.0})
            result = await self._run_once(instance_id, code, False)
        assert isinstance(result, ToolResult)
        return result

    async def _run_once(self, instance_id: str, code: str, confined: bool) -> ToolResult | str:
        """One call; or, when the kernel refused the boundary, why (no code ran)."""
        workdir = None if confined else tempfile.mkdtemp(prefix="rlhfctl-python-", dir=self.work_root)
        status_read, status_write = os.pipe()
        child = _Child(workdir, keep_bytes=4 * self.max_output_chars + 16, confined=confined)
        self._live.setdefault(instance_id, set()).add(child)
        try:
            started = time.monotonic()
            await asyncio.get_running_loop().subprocess_exec(
                lambda: child,
                *launcher_command(confined, self._settings(status_write, confined), self.site_packages),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd="/" if confined else workdir,
                env=_scrubbed_env("/work" if confined else workdir),
                pass_fds=(status_write,),
                start_new_session=True,  # its own process group, killed as a whole
            )
            os.close(status_write)
            status_write = -1
            timed_out = not await self._send_and_wait(child, code)
            await child.stop()  # the timed-out call, and whatever it left behind
            await child.exited
            await _wait_briefly(child.closed, _DRAIN_AFTER_EXIT_S)
            status = _read_status(status_read)
            if confined and status.startswith("boundary=0"):
                return status[11:] or "no reason given"
            return self._result(child, timed_out, status, time.monotonic() - started)
        finally:
            for fd in (status_read, status_write):
                if fd >= 0:
                    os.close(fd)
            child.kill_group()
            if child.transport is not None:
                child.transport.close()
            self._forget(instance_id, child)
            if workdir is not None:
                _remove_tree(workdir)

    def _forget(self, instance_id: str, child: _Child) -> None:
        runs = self._live.get(instance_id)
        if runs is not None:
            runs.discard(child)
            if not runs:
                del self._live[instance_id]

    def _settings(self, status_fd: int, confined: bool) -> dict[str, Any]:
        """What the launcher (or, unconfined, the child) needs to know."""
        settings = dict(self.limits, status_fd=status_fd, isolate_network=self.isolate_network)
        if confined:
            settings.update(readonly_paths=list(self.readonly_paths), site_packages=self.site_packages,
                            work_bytes=self.work_bytes, deadline_s=self.timeout_s + _DEADLINE_AFTER_TIMEOUT_S)
        else:
            settings.update(require_network_isolation=self.require_network_isolation)
        return settings

    async def _send_and_wait(self, child: _Child, code: str) -> bool:
        """Send the code and wait for the child to exit; False when the wall-clock timeout expired first."""
        assert child.transport is not None
        stdin = child.transport.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)
        stdin.write(code.encode("utf-8", errors="replace"))
        stdin.close()  # after the buffered code is written; a child that exits first just drops it
        return await _wait_briefly(child.exited, self.timeout_s)

    def _result(self, run: _Child, timed_out: bool, status: str, seconds: float) -> ToolResult:
        if run.confined:
            isolated = self.isolate_network and status == "boundary=1"
        else:
            isolated = status.startswith("net=1")
            if self.isolate_network and not isolated:
                self._warn_network(status)
        output, truncated = self._shown_output(run)
        assert run.transport is not None
        returncode = run.transport.get_returncode()
        if timed_out:
            head = f"error: timed out after {self.timeout_s:g} s"
        elif run.confined and status.startswith("error "):
            head = f"error: {status[6:]}"
        elif returncode == sandbox_child.ISOLATION_REFUSED and self.require_network_isolation and not isolated:
            head = f"error: network isolation is required but unavailable here ({status[6:] or 'no status'})"
        elif returncode and returncode < 0:
            head = f"error: killed by signal {_signal_name(-returncode)}"
        elif returncode:
            head = f"error: exit status {returncode}"
        else:
            head = ""
        if head:
            text = f"{head}\n{output}" if output else head
        else:
            text = output if output else "(no output)"
        metrics = {
            "ok": 0.0 if head else 1.0,
            "confined": float(run.confined),
            "timed_out": float(timed_out),
            "network_isolated": float(isolated),
            "truncated": float(truncated),
            "seconds": seconds,
        }
        return ToolResult(text, metrics=metrics)

    def _shown_output(self, run: _Child) -> tuple[str, bool]:
        text = run.output.decode("utf-8", errors="replace")
        if len(text) > self.max_output_chars or run.dropped:
            return text[: self.max_output_chars] + TRUNCATED, True
        return text, False

    def _warn_network(self, status: str) -> None:
        if not self._warned_network:
            self._warned_network = True
            logger.warning(
                "python tool: no network namespace (%s); code runs with the host network. "
                "Set require_network_isolation: true to refuse to run without one.", status[6:] or "no status")


def run_programs(sandbox: PythonSandbox, programs: Sequence[str]) -> list[ToolResult]:
    """Run each program as one call of ``sandbox`` (at most its ``max_concurrent`` at once), from synchronous
    code: the tool's own calls, for callers without an event loop (the code-execution reward). In order."""

    async def run_all() -> list[ToolResult]:
        async def one(index: int, program: str) -> ToolResult:
            instance = f"program-{index}"
            try:
                return await sandbox.execute(instance, {"code": program})
            finally:
                await sandbox.release(instance)

        return list(await asyncio.gather(*(one(index, program) for index, program in enumerate(programs))))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_all())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # inside a running loop: a loop of its own
        return pool.submit(asyncio.run, run_all()).result()


def _scrubbed_env(workdir: str) -> dict[str, str]:
    """The child's whole environment: nothing inherited, so no tokens or keys reach the code."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def _absolute_paths(paths: Any) -> tuple[str, ...]:
    """``readonly_paths`` checked: a list of absolute paths (shown at the same place inside)."""
    if isinstance(paths, str) or not all(isinstance(p, str) and os.path.isabs(p) for p in paths):
        raise ValueError(f"python tool: readonly_paths must be a list of absolute paths, got {paths!r}")
    normal = tuple(os.path.normpath(p) for p in paths)
    for path in normal:  # the sandbox's own mounts would hide these, or they would hide the whole boundary
        if path == "/" or any(path == top or path.startswith(top + "/") for top in ("/work", "/proc", "/dev")):
            raise ValueError(f"python tool: readonly_paths cannot show {path!r}: '/', /work, /proc and /dev are the "
                             "sandbox's own; show a folder elsewhere")
    return normal


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _wait_briefly(future: asyncio.Future[None], timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``future``; True when it completed in time."""
    try:
        await asyncio.wait_for(asyncio.shield(future), timeout=timeout_s)
    except asyncio.TimeoutError:
        return False
    return True


def _read_status(fd: int) -> str:
    """The child's one status line ('' when it died before writing it)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 4096).decode("utf-8", errors="replace").strip()
    except BlockingIOError:
        return ""


def _signal_name(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        return str(number)
    reason = {"SIGXCPU": " (CPU time limit)", "SIGKILL": "", "SIGSEGV": " (crashed)"}.get(name, "")
    return name + reason


def _remove_tree(path: str) -> None:
    """Remove the work directory, first making every directory in it writable again (code may chmod them)."""
    for root, dirs, _files in os.walk(path):
        for name in dirs:
            try:
                os.chmod(os.path.join(root, name), 0o700)
            except OSError:
                pass
    shutil.rmtree(path, ignore_errors=True)
