"""The bundled ``python`` tool: run the model's code in a confined child process, without blocking the loop.

Each call starts ``python -I -S -u sandbox_child.py`` (isolated mode: no site-packages, no ``PYTHON*``
variables, no script directory on ``sys.path``) in its own process group, in a fresh empty temporary
directory, with a scrubbed environment. The child confines itself (network namespace where the OS
allows one, resource limits; see :mod:`rlhfctl.agents.tools.sandbox_child`) before the code runs.
The parent enforces the wall-clock timeout by killing the whole process group, caps the captured
output, and removes the directory. This is damage limitation for model-written code, not a security
boundary: docs/security.md says what it does not stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from rlhfctl.agents.tool import Tool, ToolResult
from rlhfctl.agents.tools import sandbox_child

__all__ = ["PythonSandbox"]

logger = logging.getLogger(__name__)

TRUNCATED = "\n...[truncated]"
_MIB = 1024 * 1024
_DRAIN_AFTER_EXIT_S = 1.0
"""How long output is still read after the process group is killed (a detached grandchild may hold the pipe)."""


class _Child(asyncio.SubprocessProtocol):
    """One live child: its exit and the end of its output as futures, and the output read so far.

    asyncio's ``Process.wait()`` also waits for the pipes to close, which a grandchild left running
    would hold open; this protocol reports the exit itself, so the timeout and the cleanup do not wait.
    """

    def __init__(self, workdir: str, keep_bytes: int) -> None:
        loop = asyncio.get_running_loop()
        self.workdir = workdir
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

    def kill_group(self) -> None:
        """SIGKILL the child's process group (it is the group leader); nothing if it is already gone."""
        if self.transport is None or self.transport.get_pid() is None:
            return
        try:
            os.killpg(self.transport.get_pid(), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class PythonSandbox(Tool):
    """Runs a Python snippet in a child process and returns its combined stdout and stderr.

    Config (defaults in :attr:`defaults`): ``timeout_s`` wall clock; ``cpu_s`` CPU seconds;
    ``memory_mb`` address space; ``max_processes`` RLIMIT_NPROC (0 leaves it unset); ``max_file_mb``
    largest file written; ``max_output_chars`` text shown; ``max_code_chars`` longest program;
    ``max_concurrent`` children at once; ``isolate_network`` try a network namespace;
    ``require_network_isolation`` refuse to run where the OS denies one (else run, reported as
    ``network_isolated: 0``); ``site_packages`` let the child import installed packages;
    ``work_root`` where the temporary directories go.
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
        "isolate_network": True,
        "require_network_isolation": False,
        "site_packages": False,
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
        """Kill any child of this trajectory still running and remove its directory."""
        for child in self._live.pop(instance_id, set()):
            child.kill_group()
            _remove_tree(child.workdir)

    def _slots_for_this_loop(self) -> asyncio.Semaphore:
        """The bound on concurrent children (a semaphore belongs to one event loop, so one per loop)."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.max_concurrent))
        return self._slots[1]

    async def _run(self, instance_id: str, code: str) -> ToolResult:
        workdir = tempfile.mkdtemp(prefix="rlhfctl-python-", dir=self.work_root)
        status_read, status_write = os.pipe()
        child = _Child(workdir, keep_bytes=4 * self.max_output_chars + 16)
        self._live.setdefault(instance_id, set()).add(child)
        try:
            started = time.monotonic()
            await asyncio.get_running_loop().subprocess_exec(
                lambda: child,
                *self._command(status_write),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=_scrubbed_env(workdir),
                pass_fds=(status_write,),
                start_new_session=True,  # its own process group, killed as a whole
            )
            os.close(status_write)
            status_write = -1
            timed_out = not await self._send_and_wait(child, code)
            child.kill_group()  # the timed-out child, and whatever it left behind in its group
            await child.exited
            await _wait_briefly(child.closed, _DRAIN_AFTER_EXIT_S)
            return self._result(child, timed_out, _read_status(status_read), time.monotonic() - started)
        finally:
            for fd in (status_read, status_write):
                if fd >= 0:
                    os.close(fd)
            child.kill_group()
            if child.transport is not None:
                child.transport.close()
            self._forget(instance_id, child)
            _remove_tree(workdir)

    def _forget(self, instance_id: str, child: _Child) -> None:
        runs = self._live.get(instance_id)
        if runs is not None:
            runs.discard(child)
            if not runs:
                del self._live[instance_id]

    def _command(self, status_fd: int) -> list[str]:
        settings = dict(self.limits, status_fd=status_fd, isolate_network=self.isolate_network,
                        require_network_isolation=self.require_network_isolation)
        flags = ["-I", "-u", "-B"] + ([] if self.site_packages else ["-S"])
        return [sys.executable, *flags, sandbox_child.__file__, json.dumps(settings)]

    async def _send_and_wait(self, child: _Child, code: str) -> bool:
        """Send the code and wait for the child to exit; False when the wall-clock timeout expired first."""
        assert child.transport is not None
        stdin = child.transport.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)
        stdin.write(code.encode("utf-8", errors="replace"))
        stdin.close()  # after the buffered code is written; a child that exits first just drops it
        return await _wait_briefly(child.exited, self.timeout_s)

    def _result(self, run: _Child, timed_out: bool, status: str, seconds: float) -> ToolResult:
        isolated = status.startswith("net=1")
        if self.isolate_network and not isolated:
            self._warn_network(status)
        output, truncated = self._shown_output(run)
        assert run.transport is not None
        returncode = run.transport.get_returncode()
        if timed_out:
            head = f"error: timed out after {self.timeout_s:g} s"
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
