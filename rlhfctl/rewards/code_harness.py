"""The program that runs one response's tests inside the python sandbox, each case in its own child with its
own time limit, one line per case on stdout.

The code-execution reward (:mod:`rlhfctl.rewards.code_execution`) sends this file's text as the sandbox's
code, with a last line calling :func:`main` on the payload, so it uses the standard library only and imports
nothing of rlhfctl (the sandbox's interpreter runs isolated, without site-packages). The reward side imports
it only for :func:`normalize_output`, :func:`canonical_json` and the markers, so both sides share one rule.

The expected outputs never enter the sandbox: a stdin/stdout case reports the sha256 of its normalized
output, a call-based case its return value as JSON (and that JSON's sha256), an assert case whether the
assertions ran through; the reward compares outside. Lines:

- ``@@rlhfctl-compiled 1`` (or ``0 <error>``: no case runs), printed before any of the code runs;
- ``@@rlhfctl-case {"i": ..., "status": "done" | "error" | "timeout", ...}`` per case, as each ends.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import sys
import time
import types

COMPILED_MARK = "@@rlhfctl-compiled "
CASE_MARK = "@@rlhfctl-case "
VALUE_CHARS = 4096
"""A call-based return value longer than this (as JSON) comes back as its sha256 only."""
_EXIT_UNREPORTED = 70


def normalize_output(text: str) -> str:
    """Program output as compared: each line without trailing whitespace, no trailing empty lines."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def output_digest(text: str) -> str:
    """The sha256 of the normalized output: what a stdin/stdout case reports and the reward compares."""
    return hashlib.sha256(normalize_output(text).encode("utf-8", errors="replace")).hexdigest()


def canonical_json(value: object) -> str:
    """A return value as JSON with sorted keys (tuples become lists), the form its digest is taken of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _say(line: str) -> None:
    """One line to the sandbox's stdout, unbuffered (a buffer would be copied into every forked child)."""
    data = (line + "\n").encode("utf-8", errors="replace")
    while data:
        data = data[os.write(1, data):]


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".replace("\n", " ")[:300]


def main(payload: dict) -> None:
    """Compile the code, then run each case in a forked child and report it (see the module docstring)."""
    try:
        solution = compile(payload["code"], "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError) as error:
        _say(COMPILED_MARK + "0 " + _one_line(error))
        return
    _say(COMPILED_MARK + "1")
    for index, case in enumerate(payload["cases"]):
        _say(CASE_MARK + json.dumps(_run_case(solution, payload, index, case)))


def _run_case(solution: types.CodeType, payload: dict, index: int, case: object) -> dict:
    """Fork, run the case in the child (its own process group), wait at most ``timeout_s``, then kill the group."""
    kind = payload["kind"]
    paths = {name: f"case{index}.{name}" for name in ("in", "out", "err", "value")}
    if kind == "stdio":
        with open(paths["in"], "w", encoding="utf-8", errors="replace") as handle:
            handle.write(str(case))
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            _child(solution, payload, case, paths)
        finally:
            os._exit(_EXIT_UNREPORTED)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child did it first, or is gone
    status, timed_out = _wait(pid, float(payload["timeout_s"]))
    try:
        os.killpg(pid, signal.SIGKILL)  # whatever the case left running in its group
    except OSError:
        pass
    report: dict = {"i": index, "seconds": round(time.monotonic() - started, 3)}
    code = os.waitstatus_to_exitcode(status)
    if timed_out:
        report["status"] = "timeout"
    elif code != 0:
        report.update(status="error", exit=code, err=_last_line(paths["err"]))
    else:
        report["status"] = "done"
        if kind == "stdio":
            report["out"] = output_digest(_read(paths["out"], int(payload["max_output_bytes"])))
        elif kind == "call":
            value = _read(paths["value"], int(payload["max_output_bytes"]))
            report["value_sha"] = hashlib.sha256(value.encode("utf-8", errors="replace")).hexdigest()
            if len(value) <= VALUE_CHARS:
                report["value"] = value
        elif _read(paths["value"], 16) != "pass":
            report.update(status="error", exit=code, err="the code ended before its tests ran")
    for path in paths.values():
        try:
            os.unlink(path)
        except OSError:
            pass
    return report


def _wait(pid: int, timeout_s: float) -> tuple[int, bool]:
    """The child's wait status, and whether it was killed at the time limit."""
    deadline = time.monotonic() + timeout_s
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):
        handle = -1
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status, False
            left = deadline - time.monotonic()
            if left <= 0:
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                return os.waitpid(pid, 0)[1], True
            if handle >= 0:
                select.select([handle], [], [], left)
            else:
                time.sleep(min(left, 0.01))
    finally:
        if handle >= 0:
            os.close(handle)


def _read(path: str, limit: int) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _last_line(path: str) -> str:
    lines = _read(path, 1 << 20).strip().splitlines()
    return lines[-1][:300] if lines else ""


def _child(solution: types.CodeType, payload: dict, case: object, paths: dict) -> None:
    """Run one case with stdin, stdout and stderr on its files; report through the value file; never returns."""
    kind = payload["kind"]
    _limit_cpu(int(float(payload["timeout_s"])) + 1)
    stdin = os.open(paths["in"] if kind == "stdio" else os.devnull, os.O_RDONLY)
    for fd, handle in ((0, stdin), (1, _create(paths["out"])), (2, _create(paths["err"]))):
        os.dup2(handle, fd)
        os.close(handle)
    value_file = _create(paths["value"]) if kind != "stdio" else -1
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", closefd=False)
    streams = (sys.stdout, sys.stderr)
    module = types.ModuleType("__main__" if kind == "stdio" else "solution")
    sys.modules[module.__name__] = module  # `import __main__` finds the code, not this harness
    sys.argv = ["<solution>"]
    status, value = 0, None
    try:
        exec(solution, module.__dict__)  # noqa: S102 - running it is the point; the sandbox confines it
        if kind == "call":
            value = canonical_json(_call(module.__dict__, payload["fn_name"], case))
        elif kind == "assert":
            exec(compile(payload["setup"] + "\n" + str(case), "<test>", "exec"), module.__dict__)  # noqa: S102
            value = "pass"
    except SystemExit as done:
        status = done.code if isinstance(done.code, int) else int(done.code is not None)
        if kind != "stdio":
            status = status or 1  # an exit before the call or the assertions: they did not run
    except BaseException:  # noqa: BLE001 - the code's error is the case's failure
        import traceback

        traceback.print_exc()
        status = 1
    for stream in (*streams, sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or replaced stream
            pass
    if status == 0 and value is not None:
        os.write(value_file, value.encode("utf-8", errors="replace"))
    os._exit(status)


def _limit_cpu(seconds: int) -> None:
    """This case's own CPU limit (the forked child's count starts at 0): the sandbox's covers all the cases."""
    import resource

    try:
        _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        wanted = seconds + 1 if hard == resource.RLIM_INFINITY else min(seconds + 1, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (min(seconds, wanted), wanted))
    except (OSError, ValueError):
        pass  # the wall-clock limit still holds


def _create(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)


def _call(namespace: dict, fn_name: str, arguments: object) -> object:
    """``fn_name(*arguments)``: a top-level function, else a method of ``Solution()`` (LeetCode's layout)."""
    function = namespace.get(fn_name)
    if function is None and isinstance(namespace.get("Solution"), type):
        function = getattr(namespace["Solution"](), fn_name, None)
    if not callable(function):
        raise NameError(f"the code defines no function {fn_name!r}")
    return function(*arguments) if isinstance(arguments, list) else function(arguments)
