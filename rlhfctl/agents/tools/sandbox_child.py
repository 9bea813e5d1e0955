"""The child side of the ``python`` tool: confine this process, then run the code read from stdin.

Run as a script by :class:`rlhfctl.agents.tools.PythonSandbox` with ``allow_unconfined`` where the kernel
refuses the boundary of :mod:`rlhfctl.agents.tools.sandbox_boundary` (``python -I -S -u sandbox_child.py
<settings>``, a dict in :mod:`marshal`'s format, hex-encoded), never imported by user code; the boundary's
worker also runs the code through :func:`run_user_code`. It uses the standard library only, since the
isolated interpreter sees no site-packages. Before the user's code runs it:

1. enters a new user and network namespace when asked (``unshare(CLONE_NEWUSER | CLONE_NEWNET)``),
   so only a loopback interface that is down exists, and maps its own uid/gid into the namespace;
2. sets the resource limits (CPU seconds, address space, processes, file size, no core files);
3. writes one status line to the status pipe (``net=1`` or ``net=0 <why>``) and closes it.

If isolation was required and the OS refused it, it exits with ``ISOLATION_REFUSED`` before running
anything.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import sys
import types

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
ISOLATION_REFUSED = 97
"""Exit status when ``require_network_isolation`` is set and the namespace could not be made."""


def enter_network_namespace() -> str:
    """Move into a fresh user + network namespace; '' on success, else why the OS refused."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWNET
    try:
        if hasattr(os, "unshare"):  # Python >= 3.12
            os.unshare(flags)
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(flags) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, os.strerror(errno))
    except (OSError, AttributeError) as error:
        return f"unshare failed: {error}"
    # Map our own ids, so files we create are ours and getuid() is unchanged; best effort.
    for path, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:
            with open(f"/proc/self/{path}", "w") as handle:
                handle.write(text)
        except OSError:
            pass
    return ""


def set_limits(settings: dict, strict: bool = False) -> None:
    """Lower the soft and hard limits (never raise them: a limit already lower is kept). ``strict`` (the namespace
    boundary, where every limit must hold) lets a refused limit raise; unconfined, it is skipped."""
    wanted = {
        resource.RLIMIT_CPU: (settings["cpu_s"], settings["cpu_s"] + 1),
        resource.RLIMIT_AS: (settings["memory_bytes"],) * 2,
        resource.RLIMIT_FSIZE: (settings["file_bytes"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    if settings.get("max_processes") and hasattr(resource, "RLIMIT_NPROC"):
        wanted[resource.RLIMIT_NPROC] = (settings["max_processes"],) * 2
    for limit, (soft, hard) in wanted.items():
        _soft_now, old_hard = resource.getrlimit(limit)
        if old_hard != resource.RLIM_INFINITY:
            hard = min(hard, old_hard)
        soft = min(soft, hard)
        try:
            resource.setrlimit(limit, (soft, hard))
        except (OSError, ValueError):
            if strict:
                raise


def run_user_code(source: str) -> None:
    """Execute ``source`` as ``__main__``; an uncaught exception prints its traceback and exits 1."""
    try:
        code = compile(source, "<code>", "exec")
    except (SyntaxError, ValueError) as error:
        import traceback  # here, not at the top: it costs ~10 ms of start-up that a call without an error skips

        traceback.print_exception(type(error), error, None)
        sys.exit(1)
    sys.argv = ["<code>"]
    main_module = types.ModuleType("__main__")
    sys.modules["__main__"] = main_module  # `import __main__` in the code finds the code, not this file
    try:
        exec(code, main_module.__dict__)  # noqa: S102 - running it is the point; the caller confined us
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - the user's error, reported as Python would
        import traceback  # as above: only on an error

        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        sys.stderr.flush()
        sys.exit(1)


def main() -> None:
    """Read settings from argv and code from stdin, confine, run."""
    settings = marshal.loads(bytes.fromhex(sys.argv[1]))
    refused = enter_network_namespace() if settings["isolate_network"] else "disabled by config"
    set_limits(settings)
    source = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    status_fd = settings["status_fd"]
    os.write(status_fd, (f"net=0 {refused}" if refused else "net=1").encode() + b"\n")
    os.close(status_fd)
    if refused and settings["require_network_isolation"]:
        sys.exit(ISOLATION_REFUSED)
    del settings, refused, status_fd
    run_user_code(source)


if __name__ == "__main__":
    main()
