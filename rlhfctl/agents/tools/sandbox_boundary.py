"""The boundary of the ``python`` tool: run code in fresh Linux namespaces, as bubblewrap and nsjail do.

Run as a script by :class:`rlhfctl.agents.tools.PythonSandbox` (``python -I -S -u sandbox_boundary.py
<settings>``, the code on stdin; the settings are a dict in :mod:`marshal`'s format, hex-encoded, as ``json``
alone would add 12 ms of imports to every call), never imported by user code. Standard library only
(``ctypes`` for mount(2), pivot_root(2), mount_setattr(2), capset(2) and prctl(2)). Four processes take part:

- **launcher** (this script, in the host's namespaces): forks the *mapper*, calls ``unshare`` for new user,
  mount, PID, network, IPC and UTS namespaces, forks the *init*, and reports to the tool on the status
  pipe. On ``SIGTERM`` (the tool's timeout) it kills the init and waits until the namespace is empty.
- **mapper**: stays outside and writes the launcher's ``uid_map``/``gid_map``: one id, the caller's own,
  or 65534 (nobody) when the caller is root, so the kernel's process cap binds and root's files are not ours.
- **init** (PID 1 of the new namespace): builds a new root (a read-only tmpfs with the system, the
  interpreter and ``readonly_paths`` bound read-only, a writable tmpfs at ``/work``, a fresh ``/proc``),
  ``pivot_root``s into it, sets the limits, drops every capability, forks the *worker* and reaps orphans.
  When the worker ends, init exits, and the kernel kills every process left in the namespace.
- **worker**: runs the code as ``__main__`` in ``/work``.

Status lines (one per call): ``boundary=1``, ``boundary=0 <why>`` (the kernel refused; exit ``REFUSED``)
or ``error <why>`` (a configured path cannot be shown; exit ``SETUP_ERROR``).
"""

from __future__ import annotations

import _signal as signal  # the C module: `signal` would import enum, 4 ms of every call's start-up
import ctypes
import marshal
import os
import resource
import sys

REFUSED = 96
"""Exit status when the kernel refused a namespace, a mount or pivot_root: no code ran."""
SETUP_ERROR = 95
"""Exit status when a configured read-only path cannot be shown: no code ran."""
NOBODY = 65534
"""The uid and gid the code runs as (inside and outside) when the caller is root."""

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH, AT_FDCWD, AT_RECURSIVE, O_PATH = 2, -100, 0x8000, 0o10000000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 1, 2, 4
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
_SYSCALLS = {"x86_64": {"pivot_root": 155, "mount_setattr": 442}, "aarch64": {"pivot_root": 41, "mount_setattr": 442}}

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_PATHS = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
DEVICES = ("null", "zero", "full", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


class Refused(Exception):
    """The kernel said no to a namespace, a mount or a pivot: the boundary cannot be built here."""


class SetupError(Exception):
    """The configuration asks for something that cannot be shown (a missing read-only path)."""


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = (lambda text: None if text is None else os.fsencode(text))
    _check(_libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
           f"mount {target}")


def _syscall(name: str, *args: object) -> int:
    number = _SYSCALLS.get(os.uname().machine, {}).get(name)
    if number is None:
        raise Refused(f"no {name} syscall number for {os.uname().machine}")
    return _check(_libc.syscall(ctypes.c_long(number), *args), name)


def _prctl(option: int, value: int) -> int:
    return _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl {option}")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _make_read_only(target: str) -> None:
    """Read-only, nosuid, nodev, recursively (mount_setattr); the top mount alone on kernels before 5.12."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    try:
        _syscall("mount_setattr", ctypes.c_int(AT_FDCWD), os.fsencode(target), ctypes.c_uint(AT_RECURSIVE),
                 ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
        return
    except (OSError, Refused):
        pass
    flags = os.statvfs(target).f_flag & (MS_NOEXEC | MS_NOSUID | MS_NODEV)  # the ST_ bits equal the MS_ ones
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | flags)


def ids_inside() -> tuple[int, int]:
    """The (uid, gid) the code runs as: the caller's own, or nobody's when the caller is root."""
    if os.geteuid() == 0:
        return NOBODY, NOBODY
    return os.geteuid(), os.getegid()


def shown_paths(readonly_paths: list[str], site_packages: bool) -> list[str]:
    """The host paths shown read-only, outermost first: the system, this interpreter, the configured ones."""
    interpreter = [os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(os.__file__)]
    for entry in sys.path:  # lib-dynload, and site-packages when the child may import them (never the project)
        packages = entry.endswith(("site-packages", "dist-packages"))
        if (site_packages if packages else entry.startswith(sys.base_prefix)) and os.path.isdir(entry):
            interpreter.append(entry)
    wanted = [p for p in SYSTEM_PATHS + ETC_PATHS if os.path.lexists(p)] + interpreter + list(readonly_paths)
    kept: list[str] = []
    folders: list[str] = []  # the real paths of the kept folders: what is below them is shown already
    for path in sorted({os.path.normpath(p) for p in wanted}, key=lambda p: (p.count("/"), p)):
        real = os.path.realpath(path)
        if any(real == folder or real.startswith(folder + "/") for folder in folders):
            continue  # e.g. /lib/x when /lib -> usr/lib and /usr is shown
        kept.append(path)
        if not os.path.islink(path):
            folders.append(real.rstrip("/"))
    return kept


def enter_namespaces(isolate_network: bool) -> None:
    """unshare() into new namespaces, the uid/gid maps written by a forked mapper that stays outside."""
    uid, gid = ids_inside()
    if os.geteuid() == 0:
        os.setgroups([])  # root's supplementary groups would open files of group root to the code
    go_read, go_write = os.pipe()
    mapper = os.fork()
    if mapper == 0:
        os.close(go_write)
        os._exit(0 if os.read(go_read, 1) == b"x" and _write_maps(os.getppid(), uid, gid) else 1)
    os.close(go_read)
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    flags |= CLONE_NEWNET if isolate_network else 0
    try:
        _check(_libc.unshare(ctypes.c_int(flags)), "unshare")
    except OSError as error:
        os.close(go_write)
        os.waitpid(mapper, 0)
        raise Refused(error.strerror) from None
    os.write(go_write, b"x")
    os.close(go_write)
    if os.waitstatus_to_exitcode(os.waitpid(mapper, 0)[1]) != 0:
        raise Refused("could not write the new user namespace's uid_map/gid_map")


def _write_maps(pid: int, uid: int, gid: int) -> bool:
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/{pid}/{name}", "w") as handle:
                handle.write(text)
    except OSError:
        return False
    return True


def open_shown(paths: list[str], readonly_paths: list[str]) -> list[tuple[str, int | str]]:
    """Each shown path with an O_PATH descriptor (opened with the caller's rights) or its symlink target."""
    opened: list[tuple[str, int | str]] = []
    for path in paths:
        if os.path.islink(path) and path not in readonly_paths:
            opened.append((path, os.readlink(path)))
            continue
        try:
            opened.append((path, os.open(path, O_PATH | os.O_CLOEXEC)))
        except OSError as error:
            if path in readonly_paths:
                raise SetupError(f"readonly_paths entry {path!r} cannot be shown: {error.strerror}") from None
    return opened


def build_root(shown: list[tuple[str, int | str]], settings: dict, uid: int, gid: int) -> None:
    """Make the new root under /tmp (a private tmpfs over it), pivot into it, make it read-only."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    os.chdir("/tmp")
    in_work = [(path, source) for path, source in shown if path == "/work" or path.startswith("/work/")]
    for path, source in shown:
        if (path, source) not in in_work:
            _show(path, source)
    _populate(settings, uid, gid)
    for path, source in in_work:  # an interpreter under the host's /work: shown over the work tmpfs
        _show(path, source)
    _check(_syscall("pivot_root", b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "umount old root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _show(path: str, source: int | str) -> None:
    """Show one host path at the same place under the new root (cwd): a read-only bind, or the same symlink."""
    target = "." + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if isinstance(source, str):
        os.symlink(source, target)
        return
    if os.path.isdir(f"/proc/self/fd/{source}"):
        os.mkdir(target)
    else:
        open(target, "x").close()
    _mount(f"/proc/self/fd/{source}", target, None, MS_BIND | MS_REC)
    _make_read_only(target)
    os.close(source)


def _populate(settings: dict, uid: int, gid: int) -> None:
    """The writable /work (also at /tmp and /dev/shm), the devices, /proc and the names of the sandbox user."""
    for folder in ("work", "tmp", "dev/shm", "proc", "etc"):
        os.makedirs(folder, exist_ok=True)
    _mount("tmpfs", "work", "tmpfs", MS_NOSUID | MS_NODEV, f"size={settings['work_bytes']},mode=0700")
    for alias in ("tmp", "dev/shm"):
        if not os.listdir(alias):  # one holding a shown path (a readonly_paths entry under /tmp) stays read-only
            _mount("work", alias, None, MS_BIND)
    for device in DEVICES:
        open(f"dev/{device}", "x").close()
        _mount(f"/dev/{device}", f"dev/{device}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"dev/{name}")
    try:  # some containers forbid a new proc; then /proc stays empty, which still hides the host
        _mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass
    with open("etc/passwd", "w") as handle:
        handle.write(f"sandbox:x:{uid}:{gid}:sandbox:/work:/bin/sh\n")
    with open("etc/group", "w") as handle:
        handle.write(f"sandbox:x:{gid}:\n")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_privileges() -> None:
    """No capabilities, now or after an execve (bounding set emptied, no_new_privs)."""
    for capability in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(capability), 0, 0, 0) != 0:
            break  # EINVAL past the last capability this kernel knows
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def run_init(settings: dict, code: str, report: int) -> None:
    """PID 1: build the root, confine, fork the worker, reap; exit when the worker does (never returns)."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        uid, gid = ids_inside()
        readonly = settings["readonly_paths"]
        shown = open_shown(shown_paths(readonly, settings["site_packages"]), readonly)
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # caps in the new namespace stay until drop_privileges
        build_root(shown, settings, uid, gid)
        try:
            with open("/proc/sys/user/max_user_namespaces", "w") as handle:
                handle.write("0")  # no nested user namespace, where the code would get capabilities back
        except OSError:
            pass
        _run_user_code[2](settings, strict=True)  # sandbox_child.set_limits: lower every limit, or fail the call
        drop_privileges()
        _prctl(PR_SET_DUMPABLE, 0)  # the worker may not ptrace or read init
    except SetupError as error:
        os.write(report, f"error {error}\n".encode())
        os._exit(SETUP_ERROR)
    except (OSError, Refused) as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        os.write(report, f"refused {why}\n".encode())
        os._exit(REFUSED)
    os.write(report, b"ready\n")
    worker = os.fork()
    if worker == 0:
        run_worker(code)
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda sig, _frame: os.kill(worker, sig))  # forward to the code
    while True:
        pid, status = os.waitpid(-1, 0)  # orphans are reparented here: reap them too
        if pid == worker:
            os.write(report, f"exit {status}\n".encode())
            os._exit(0)  # the kernel now kills whatever is left in the namespace


def run_worker(code: str) -> None:
    """Run the code in /work as ``__main__`` with only stdin, stdout and stderr open (never returns)."""
    _prctl(PR_SET_DUMPABLE, 1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.closerange(3, 65536)
    os.chdir("/work")
    sys.executable = sys._base_executable = _run_user_code[1]  # type: ignore[attr-defined]
    try:
        _run_user_code[0](code)
        status = 0
    except SystemExit as done:
        status = done.code if isinstance(done.code, int) else int(done.code is not None)
        if done.code is not None and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
    exit_fast(status)


def exit_fast(status: int) -> None:
    """End as the interpreter would (threads joined, atexit run, output flushed) without tearing it down:
    finalizing the modules this fork inherited costs 8 ms a call and does nothing for the code."""
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()  # type: ignore[attr-defined]  # waits for non-daemon threads, as exit does
    import atexit  # built in, but only this exit path needs it: the script's imports are kept to its start-up's minimum

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


_run_user_code: list = []
"""sandbox_child.run_user_code (the one home of "run code as __main__"), the interpreter's real path and
sandbox_child.set_limits (the one home of the limits), all found by main() before the pivot hides their files."""
_init_pid: list[int] = []


def _stop(_sig: int, _frame: object) -> None:
    """The tool's timeout (SIGTERM), or the deadline's (SIGALRM): kill init, so the kernel empties the namespace;
    launch() then waits for it."""
    if _init_pid:
        os.kill(_init_pid[0], signal.SIGKILL)
    else:
        os._exit(128 + signal.SIGTERM)


def launch(settings: dict, code: str) -> tuple[str, int]:
    """Build the namespaces and run the code; (status line, the init's last report) as the tool sees them."""
    try:
        enter_namespaces(settings["isolate_network"])
    except Refused as error:
        return f"boundary=0 {error}", REFUSED
    report_read, report_write = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(report_read)
        run_init(settings, code, report_write)
    _init_pid.append(init)
    os.close(report_write)
    with os.fdopen(report_read, "rb") as report:  # lines: "ready" then "exit <status>", or why it stopped
        first = report.readline().decode("utf-8", errors="replace").strip()
        if first == "ready":
            os.write(settings["status_fd"], b"boundary=1\n")
            os.close(settings["status_fd"])
            last = report.readline().decode("utf-8", errors="replace").strip()
        else:
            last = first
    os.waitpid(init, 0)  # returns once every process of the namespace is gone
    if first.startswith("refused "):
        return f"boundary=0 {first[8:]}", REFUSED
    if first.startswith("error "):
        return first, SETUP_ERROR
    return "", int(last[5:]) if last.startswith("exit ") else -signal.SIGKILL


def main() -> None:
    """Read settings from argv and code from stdin, run the code in the boundary, exit as the code did."""
    signal.signal(signal.SIGTERM, _stop)
    settings = marshal.loads(bytes.fromhex(sys.argv[1]))
    signal.signal(signal.SIGALRM, _stop)  # a backstop if the tool died and cannot time the call out any more
    signal.setitimer(signal.ITIMER_REAL, settings["deadline_s"])
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sandbox_child  # a sibling script; -I left this folder off sys.path

    del sys.path[0]
    _run_user_code[:] = [sandbox_child.run_user_code, os.path.realpath(sys.executable),  # resolved while visible
                         sandbox_child.set_limits]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    code = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    status, outcome = launch(settings, code)
    if status:
        os.write(settings["status_fd"], status.encode() + b"\n")
        os._exit(outcome)
    if outcome < 0 or os.WIFSIGNALED(outcome):  # die as the code died, so the tool reports the signal
        number = -outcome if outcome < 0 else os.WTERMSIG(outcome)
        if number != signal.SIGKILL:
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(outcome))


if __name__ == "__main__":
    main()
