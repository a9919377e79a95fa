"""A sandbox for model-written Python: run a program, or check a function against cases.

Owns the isolation of untrusted code and nothing else: :func:`run_python` runs a source
text in a separate, limited process and says how it ended; :func:`check_function` defines a
function from a program and calls it on test cases in one such process. It knows nothing
about workflows, rewards, Kafka or training.

Layers (each run, in this order):

1. **Namespaces** (where the kernel allows unprivileged user namespaces; probed once and
   cached, :func:`namespaces_available`). The child is started by ``unshare`` in new user
   (uid 0 mapped to the caller), network, mount and PID namespaces, with a fresh ``/proc``:

   * network: the new namespace has only a loopback device, and it is down. Every
     ``connect`` (127.0.0.1 included: that is the namespace's own loopback, not the host's)
     and every DNS lookup fails. ``RunResult.network_isolated`` is True.
   * filesystem: every mount is made read-only recursively (``mount_setattr``) and only
     the throwaway work directory is bind-mounted writable. The program runs as uid 0 of
     the namespace with no capabilities at all (locked SECBIT_NOROOT, empty bounding set,
     no_new_privs), so it cannot make the mounts writable again.
   * processes: the launcher is PID 1 of the namespace; when it exits (the program's main
     process ended, or the wall-clock kill) the kernel kills everything left inside, even
     processes that called ``setsid``. Host processes are invisible.

2. **Resource limits** on the program process (``setrlimit`` in a forked child of the
   launcher, before ``exec``): CPU seconds (``RLIMIT_CPU``, rounded up to whole seconds;
   the hard limit one second later), address space (``RLIMIT_AS``), file size
   (``RLIMIT_FSIZE``), no core files, and the process count. ``Limits.processes`` is the
   number of tasks (threads count) the program may have, itself included:

   * ``RLIMIT_NPROC`` counts every task of a user, so a bare 32 would make even the
     child's start fail on a busy machine. Inside a user namespace the kernel (5.14+)
     counts per namespace, so the limit is ``processes + 2`` (``unshare`` and the launcher
     are in it); without namespaces it is the user's current task count (read from
     ``/proc`` at each run) plus ``processes``, which is only approximate.
   * The kernel never applies ``RLIMIT_NPROC`` to real root (our uid 0 maps to it when the
     caller is root). For root, each run gets its own cgroup-v1 ``pids`` group
     (``/sys/fs/cgroup/pids``, ``pids.max = processes + 1`` for the launcher); after the
     run every task still in it is killed and the group removed. Without that hierarchy a
     root caller has no process limit but the wall clock.

3. **Wall clock**: after ``Limits.wall_s`` the whole process group is killed (SIGKILL), and
   with namespaces the PID namespace with it.

4. **Environment**: ``python -I -S -B`` of :data:`sys.executable` (no site-packages, no
   ``PYTHON*`` variables, no user site), a minimal environment (PATH, HOME and TMPDIR in the
   work directory, a UTF-8 locale), a new session, a temporary work directory removed
   afterwards; stdout and stderr are kept up to ``Limits.output_kb`` each (the rest is
   read and dropped, so a chatty program cannot block or fill the caller's memory).

5. **Audit hook, only without namespaces**: the program's interpreter refuses opening files
   for writing (and removing, renaming, creating directories) outside the work directory,
   socket ``connect``/``bind``/``sendto``, ``os.system``, ``subprocess``, ``exec``/spawn.

What this does NOT stop:

* Reading: every file the caller's user can read is readable by the program (source trees,
  home directory). Do not run the sandbox as a user that can read secrets.
* Without namespaces (``network_isolated=False``): the audit hook is a speed bump, not a
  wall. ``ctypes`` or a C extension bypasses it (network, files, processes), and a
  non-root caller's process-group kill misses a process that called ``setsid``.
* CPU time is per process: a program that forks up to the process limit can use that many
  cores until the wall clock ends it. Memory is per process too (``RLIMIT_AS``).
* Kernel exploits; there is no seccomp filter.
* :func:`check_function` runs its harness in the same interpreter as the program; results
  travel on a separate pipe, tagged with a nonce the program never sees in its inputs, and
  are compared in the caller with ``==`` on plain data, so printing fake results or
  returning objects with a lying ``__eq__`` does not help. A program that deliberately
  searches its own interpreter (``gc``, frames) for the harness's pipe and nonce can forge.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

__all__ = ["Limits", "RunResult", "CheckResult", "run_python", "check_function",
           "namespaces_available"]

_log = logging.getLogger(__name__)
_HERE = os.path.abspath(__file__)
_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
_RESULTS_CAP = 8 << 20  # bytes of check_function results kept (values can be large)
_PIDS_HIERARCHY = "/sys/fs/cgroup/pids"  # cgroup v1; under v2 a delegated subtree is needed
_GRACE_S = 2.0  # after the launcher ended or was killed: time to drain the pipes


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use."""

    cpu_s: float = 2.0  #: CPU seconds of the program process (RLIMIT_CPU, rounded up)
    wall_s: float = 5.0  #: wall-clock seconds, then the whole process group is killed
    memory_mb: int = 256  #: address space of each process (RLIMIT_AS)
    processes: int = 32  #: tasks (threads too) the program may have, itself included
    file_mb: float = 1.0  #: largest file the program may write (RLIMIT_FSIZE)
    output_kb: int = 64  #: stdout and stderr kept, each

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_mb", "processes", "file_mb", "output_kb"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class RunResult:
    """How one sandboxed run ended.

    ``reason`` is one of ``"ok"``, ``"timeout"`` (wall clock), ``"cpu_limit"``,
    ``"memory_limit"`` (a ``MemoryError`` ended it), ``"file_limit"``, ``"crash"`` (SIGSEGV,
    SIGBUS, SIGILL, SIGFPE, SIGABRT), ``"exit_<code>"``, ``"signal_<NAME>"`` (any other
    signal) or ``"sandbox_error"`` (the sandbox itself failed; ``stderr`` says why).
    """

    ok: bool  #: exited 0 within every limit
    reason: str
    returncode: int | None  #: exit code, or minus the signal number; None on timeout/error
    stdout: str
    stderr: str
    duration_s: float
    network_isolated: bool  #: True when the child ran in a new network namespace


@dataclass(frozen=True)
class CheckResult:
    """The outcome of :func:`check_function`.

    ``reason`` is ``"ok"`` (every case passed), ``"wrong_answer"``, ``"syntax_error"``,
    ``"no_function"``, or the :class:`RunResult` reason when the process did not end well
    (cases that finished before a timeout keep their result).
    """

    passed: list[bool]  #: one per case; False for all when the program could not run
    reason: str
    detail: str = ""  #: the first failure, a traceback tail, or the syntax error


@cache
def namespaces_available() -> bool:
    """Whether runs get user, network, mount and PID namespaces here (probed once)."""
    if shutil.which("unshare") is None:
        why = "no unshare binary (util-linux)"
    else:
        result = _run(["-c", "pass"], stdin="", limits=Limits(), namespaces=True)
        if result.ok and result.network_isolated:
            return True
        why = _tail(result.stderr, 2) or result.reason
    _log.warning("sandbox: no user/network/mount namespaces here (%s); programs run with "
                 "rlimits and an audit hook only, network_isolated=False", why)
    return False


def run_python(source: str, *, stdin: str = "", limits: Limits = Limits()) -> RunResult:
    """Run ``source`` as a program in the sandbox, with ``stdin`` as its standard input."""
    if not isinstance(source, str):
        raise TypeError(f"run_python: source must be str, got {type(source).__name__}")
    return _run(["program.py"], stdin=stdin, limits=limits, files={"program.py": source},
                namespaces=namespaces_available())


def check_function(program: str, entry: str, cases: Sequence[tuple[Sequence[Any], Any]],
                   *, limits: Limits = Limits()) -> CheckResult:
    """Define ``program``, call ``entry(*args)`` for every ``(args, expected)`` case.

    All cases run in ONE sandboxed process. A case passes when the call returns plain data
    (None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset, nested) that
    equals ``expected`` (``==`` in the caller, so a tuple never equals a list); a case that
    raises, or returns anything else, fails. ``args`` must be picklable.
    """
    if not isinstance(entry, str) or not entry.isidentifier():
        raise ValueError(f"check_function: entry must be a function name, got {entry!r}")
    try:
        case_list = [(tuple(args), expected) for args, expected in cases]
    except (TypeError, ValueError) as e:
        raise ValueError(f"check_function: each case must be (args, expected): {e}") from None
    try:
        cases_blob = pickle.dumps([args for args, _ in case_list])
    except Exception as e:
        raise ValueError(f"check_function: case arguments must be picklable: {e}") from None
    nonce = secrets.token_hex(16)
    failed = [False] * len(case_list)
    run, lines = _run(["-", "--check", "program.py", entry, "cases.pkl"], stdin=nonce + "\n",
                      limits=limits, files={"program.py": program}, blobs={"cases.pkl": cases_blob},
                      namespaces=namespaces_available(), with_results=True)
    got: dict[int, dict] = {}
    for line in lines:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict) or message.get("nonce") != nonce:
            continue
        if "error" in message:  # the harness could not start the cases
            return CheckResult(failed, str(message["error"]), str(message.get("detail", "")))
        got.setdefault(message.get("case"), message)
    passed, first_failure = [], ""
    for i, (_, expected) in enumerate(case_list):
        ok, why = _judge(got.get(i), expected)
        passed.append(ok)
        if not ok and not first_failure:
            first_failure = f"case {i}: {why}"
    if run.reason != "ok":
        return CheckResult(passed, run.reason, _tail(run.stderr) or first_failure)
    if all(passed):
        return CheckResult(passed, "ok")
    return CheckResult(passed, "wrong_answer", first_failure)


def _judge(message: dict | None, expected: Any) -> tuple[bool, str]:
    if message is None:
        return False, "no result (the program ended first)"
    if not message.get("ok"):
        return False, str(message.get("detail", "raised"))[:500]
    try:
        value = _decode(message["value"])
    except Exception as e:  # a malformed value is the program's failure
        return False, f"unreadable result: {e}"
    if value == expected:
        return True, ""
    return False, f"returned {value!r:.200}, expected {expected!r:.200}"


def _tail(text: str, lines: int = 5) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# --- the caller's side of a run ----------------------------------------------------------


def _run(args: list[str], *, stdin: str, limits: Limits, namespaces: bool,
         files: dict[str, str] | None = None, blobs: dict[str, bytes] | None = None,
         with_results: bool = False):
    """Run ``python -I -S -B *args`` in the sandbox; ``"-"`` in args is this module.

    Files land in a read-only-to-the-program root next to the writable ``work/`` directory
    (the program's cwd). Returns the :class:`RunResult`, and with ``with_results`` also the
    lines the program's child wrote on the results pipe (its fd number is appended to args).
    """
    start = time.monotonic()
    root = tempfile.mkdtemp(prefix="astraflow-sandbox-")
    work = os.path.join(root, "work")
    fds: list[int] = []
    cgroup = None
    try:
        os.mkdir(work)
        for name, text in (files or {}).items():
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        for name, data in (blobs or {}).items():
            with open(os.path.join(root, name), "wb") as f:
                f.write(data)
        with open(os.path.join(root, "stdin"), "w", encoding="utf-8") as f:
            f.write(stdin)
        report_r, report_w = os.pipe()
        fds += [report_r, report_w]
        results_r = results_w = None
        named = {**(files or {}), **(blobs or {})}
        program_args = [_HERE if a == "-" else os.path.join(root, a) if a in named else a
                        for a in args]
        if with_results:
            results_r, results_w = os.pipe()
            fds += [results_r, results_w]
            program_args.append(str(results_w))
        if not namespaces:
            program_args = _guarded(program_args, work)
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
               "LC_ALL": "C.UTF-8"}
        cgroup = _pids_cgroup(limits)
        spec = {"argv": program_args, "cwd": work, "env": env, "report_fd": report_w,
                "readonly_except": work if namespaces else None, "cgroup": cgroup,
                "rlimits": _rlimits(limits, namespaces)}
        launcher = [sys.executable, "-I", "-S", "-B", _HERE, "--launch", json.dumps(spec)]
        if namespaces:
            launcher = [shutil.which("unshare") or "unshare", "--user", "--map-root-user",
                        "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
                        "--", *launcher]
        passed = tuple(fd for fd in (report_w, results_w) if fd is not None)
        with open(os.path.join(root, "stdin"), "rb") as stdin_file:
            try:
                proc = subprocess.Popen(launcher, stdin=stdin_file, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, pass_fds=passed, cwd=root,
                                        env=env, start_new_session=True)
            except OSError as e:
                return _error(f"sandbox: cannot start {launcher[0]}: {e}", start, with_results)
        for fd in passed:  # the child holds its own copies; EOF must mean the child is gone
            os.close(fd)
            fds.remove(fd)
        cap = limits.output_kb * 1024
        streams = {"stdout": (proc.stdout.fileno(), cap), "stderr": (proc.stderr.fileno(), cap),
                   "report": (report_r, 1 << 16)}
        if results_r is not None:
            streams["results"] = (results_r, _RESULTS_CAP)
        try:
            data, truncated, timed_out = _collect(proc, streams, start + limits.wall_s)
        finally:
            proc.stdout.close()
            proc.stderr.close()
        result = _result(data, truncated, timed_out, limits, namespaces, start)
        if with_results:
            lines = data["results"].decode("utf-8", "replace").splitlines()
            return result, lines
        return result
    finally:
        for fd in fds:
            os.close(fd)
        _remove_tree(root)
        if cgroup:
            _remove_cgroup(cgroup)


def _rlimits(limits: Limits, namespaces: bool) -> dict[str, list[int]]:
    cpu = max(1, math.ceil(limits.cpu_s))
    memory = int(limits.memory_mb * 1024 * 1024)
    size = int(limits.file_mb * 1024 * 1024)
    # per user namespace, unshare and the launcher count too; without one, the whole user
    nproc = limits.processes + 2 if namespaces else _user_tasks() + limits.processes
    return {"CPU": [cpu, cpu + 1], "AS": [memory, memory], "FSIZE": [size, size],
            "NPROC": [nproc, nproc], "CORE": [0, 0]}


def _pids_cgroup(limits: Limits) -> str | None:
    """For root, whom RLIMIT_NPROC never stops: a v1 pids cgroup, where one is writable."""
    if os.geteuid() != 0 or not os.access(_PIDS_HIERARCHY, os.W_OK):
        return None
    _remove_stale_cgroups()
    path = os.path.join(_PIDS_HIERARCHY, f"astraflow-sandbox-{secrets.token_hex(8)}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(limits.processes + 1))  # the launcher joins it too
    except OSError:
        _remove_cgroup(path)
        return None
    return path


def _remove_cgroup(path: str) -> None:
    """Kill what is left in the group (a ``setsid`` escapee without namespaces), remove it."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:  # killed tasks leave the group a moment later
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            pass
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                for pid in f.read().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        except OSError:
            pass
        time.sleep(0.02)


def _remove_stale_cgroups(max_age_s: float = 600.0) -> None:
    """Groups of runs whose caller died before cleaning up (runs never last this long)."""
    now = time.time()
    for name in os.listdir(_PIDS_HIERARCHY):
        path = os.path.join(_PIDS_HIERARCHY, name)
        try:
            if name.startswith("astraflow-sandbox-") and now - os.stat(path).st_mtime > max_age_s:
                os.rmdir(path)  # fails, harmlessly, while tasks are still in it
        except OSError:
            pass


def _user_tasks() -> int:
    """Tasks (threads included) of this user now: what RLIMIT_NPROC counts."""
    uid, total = os.getuid(), 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Threads:"):
                        total += int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue  # the process ended meanwhile
    return total


def _guarded(program_args: list[str], work: str) -> list[str]:
    """Without namespaces: start the program behind this module's audit hook."""
    if program_args[0] == _HERE:  # the harness installs the hook itself
        return [_HERE, "--guard", work, *program_args[1:]]
    return [_HERE, "--guard", work, "--run", *program_args]


def _collect(proc: subprocess.Popen, streams: dict[str, tuple[int, int]], deadline: float):
    """Read every stream until the launcher is gone or ``deadline``; then kill the group."""
    data = {name: bytearray() for name in streams}
    truncated = {name: False for name in streams}
    selector = selectors.DefaultSelector()
    for name, (fd, _) in streams.items():
        selector.register(fd, selectors.EVENT_READ, name)
    timed_out = False

    def pump(until: float, stop_on_report: bool) -> bool:
        while selector.get_map():
            if stop_on_report and "report" not in [k.data for k in selector.get_map().values()]:
                return True
            left = until - time.monotonic()
            if left <= 0:
                return False
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                cap = streams[key.data][1]
                room = cap - len(data[key.data])
                data[key.data] += chunk[:max(room, 0)]
                truncated[key.data] |= len(chunk) > room
        return True

    try:
        timed_out = not pump(deadline, stop_on_report=True)
        _kill_group(proc)  # leftovers of a finished run, or everything on timeout
        pump(time.monotonic() + _GRACE_S, stop_on_report=False)
    finally:
        selector.close()
        _kill_group(proc)
        proc.wait()
    return data, truncated, timed_out


def _kill_group(proc: subprocess.Popen) -> None:
    try:  # the group leader is not reaped yet, so its id cannot have been reused
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _result(data, truncated, timed_out: bool, limits: Limits, namespaces: bool,
            start: float) -> RunResult:
    def text(name: str) -> str:
        out = bytes(data[name]).decode("utf-8", "replace")
        return out + "\n[output truncated]" if truncated[name] else out

    stdout, stderr = text("stdout"), text("stderr")
    report: dict[str, Any] = {}
    for line in bytes(data["report"]).decode("utf-8", "replace").splitlines():
        try:
            report.update(json.loads(line))
        except ValueError:
            pass
    duration = time.monotonic() - start
    isolated = namespaces and bool(report.get("fs_readonly"))

    def done(reason: str, code: int | None, err: str = stderr) -> RunResult:
        return RunResult(reason == "ok", reason, code, stdout, err, duration, isolated)

    if timed_out:
        return done("timeout", None)
    if "error" in report or "exit" not in report:
        why = report.get("error") or "the launcher ended without reporting the program's exit"
        return done("sandbox_error", None, f"sandbox: {why}\n{stderr}")
    code = int(report["exit"])
    if code < 0:
        signum = -code
        cpu_limit = max(1, math.ceil(limits.cpu_s))
        if signum == signal.SIGXCPU or (signum == signal.SIGKILL
                                        and report.get("cpu_s", 0) >= cpu_limit):
            return done("cpu_limit", code)
        if signum == signal.SIGXFSZ:
            return done("file_limit", code)
        if signum in _CRASH_SIGNALS:
            return done("crash", code)
        return done(f"signal_{signal.Signals(signum).name}"
                    if signum in signal.valid_signals() else f"signal_{signum}", code)
    if code == 0:
        return done("ok", 0)
    last = _tail(stderr, 1)
    if last.startswith("MemoryError"):
        return done("memory_limit", code)
    if "[Errno 27]" in last:  # EFBIG: Python ignores SIGXFSZ, so the write raises instead
        return done("file_limit", code)
    return done(f"exit_{code}", code)


def _error(message: str, start: float, with_results: bool):
    result = RunResult(False, "sandbox_error", None, "", message, time.monotonic() - start, False)
    return (result, []) if with_results else result


def _remove_tree(root: str) -> None:
    """Remove the run's directory, even where the program took its own permissions away."""
    for parent, dirs, _ in os.walk(root):
        for name in dirs:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                try:
                    os.chmod(path, 0o700)
                except OSError:
                    pass
    shutil.rmtree(root, ignore_errors=True)


# --- the sandbox's side: launcher, audit hook, check harness ------------------------------
# These run as ``python -I -S -B sandbox.py --launch|--run|--check``: stdlib only.


def _launch(spec: dict) -> int:
    """Make the filesystem read-only (with namespaces), fork, limit and exec the program.

    Writes JSON lines to the report pipe: ``fs_readonly``, then ``exit`` (``-signum`` when
    killed) and ``cpu_s`` of the program, or ``error``.
    """
    fd = spec["report_fd"]
    os.set_inheritable(fd, False)  # the program must not be able to write a fake exit

    def report(**message: Any) -> None:
        os.write(fd, (json.dumps(message) + "\n").encode())

    if spec["cgroup"]:
        try:  # "0" is this process, in any PID namespace; before /sys turns read-only
            with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as f:
                f.write("0")
        except OSError as e:
            report(error=f"cannot join {spec['cgroup']}: {e}")
            return 1
    if spec["readonly_except"]:
        try:
            _readonly_except(spec["readonly_except"])
        except OSError as e:
            report(error=f"cannot make the filesystem read-only: {e}")
            return 1
    report(fs_readonly=bool(spec["readonly_except"]))
    try:
        pid = os.fork()
    except OSError as e:
        report(error=f"cannot fork the program: {e}")
        return 1
    if pid == 0:
        try:
            for name, (soft, hard) in spec["rlimits"].items():
                resource.setrlimit(getattr(resource, f"RLIMIT_{name}"), (soft, hard))
            os.chdir(spec["cwd"])
            if spec["readonly_except"]:
                _drop_capabilities()
            os.execve(sys.executable, [sys.executable, "-I", "-S", "-B", *spec["argv"]],
                      spec["env"])
        except BaseException as e:
            report(error=f"cannot start the program: {e!r}")
        os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    report(exit=os.waitstatus_to_exitcode(status), cpu_s=usage.ru_utime + usage.ru_stime)
    return 0


def _readonly_except(writable: str) -> None:
    """In a private mount namespace: every mount read-only except ``writable``."""
    import ctypes

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    libc = ctypes.CDLL(None, use_errno=True)
    ms_bind, ms_rec, at_fdcwd, at_recursive, rdonly = 0x1000, 0x4000, -100, 0x8000, 0x1
    mount_setattr = 442  # the same number on x86_64 and the generic table (arm64)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"{what}: {os.strerror(errno)}")

    path = os.fsencode(writable)
    check(libc.mount(path, path, None, ms_bind | ms_rec, None), f"bind {writable}")
    attr = MountAttr(rdonly, 0, 0, 0)
    check(libc.syscall(mount_setattr, at_fdcwd, b"/", at_recursive, ctypes.byref(attr),
                       ctypes.sizeof(attr)), "read-only /")
    attr = MountAttr(0, rdonly, 0, 0)
    check(libc.syscall(mount_setattr, at_fdcwd, path, 0, ctypes.byref(attr),
                       ctypes.sizeof(attr)), f"writable {writable}")


def _drop_capabilities() -> None:
    """Before exec in the user namespace: uid 0 there must not keep any capability.

    With CAP_SYS_ADMIN the program could simply make the filesystem writable again
    (``mount_setattr``); with SECBIT_NOROOT (locked) exec grants root no capabilities,
    the bounding set is emptied, and no_new_privs stops set-uid binaries.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop, pr_set_securebits, pr_set_no_new_privs = 24, 28, 38
    noroot_locked = 0b101111  # NOROOT, NO_SETUID_FIXUP on and locked; KEEP_CAPS off, locked

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    check(libc.prctl(pr_set_securebits, noroot_locked, 0, 0, 0), "securebits")
    cap = 0
    while libc.prctl(pr_capbset_drop, cap, 0, 0, 0) == 0:
        cap += 1  # EINVAL past the kernel's last capability ends the loop
    check(libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0), "no_new_privs")


_REFUSED_EVENTS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
                   "os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn",
                   "os.startfile", "pty.spawn"}
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
                "os.truncate", "os.chmod", "os.chown", "shutil.rmtree", "os.utime"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _install_guard(work: str) -> None:
    """Without namespaces: refuse writes outside ``work``, sockets and new programs."""
    work = os.path.realpath(work)

    def outside(path: Any) -> bool:
        if isinstance(path, int) or path is None:
            return False  # an fd: already open
        real = os.path.realpath(os.fsdecode(path))
        return real != work and not real.startswith(work + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writing and outside(path):
                raise PermissionError(f"sandbox: writing outside the work directory: {path}")
        elif event in _PATH_EVENTS:
            if any(outside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
                raise PermissionError(f"sandbox: {event} outside the work directory: {args}")
        elif event in _REFUSED_EVENTS:
            raise PermissionError(f"sandbox: {event} is not allowed")

    sys.addaudithook(hook)


def _run_guarded(program: str) -> None:
    import runpy

    sys.argv = [program]
    runpy.run_path(program, run_name="__main__")


def _check(program_path: str, entry: str, cases_path: str, results_fd: int) -> int:
    """The harness: define the program, run each case, write one result line per case."""
    nonce = sys.stdin.readline().strip()
    write, dumps = os.write, json.dumps  # bound before the program can replace them
    with open(cases_path, "rb") as f:
        cases = pickle.load(f)
    os.set_inheritable(results_fd, False)

    def send(**message: Any) -> None:
        write(results_fd, (dumps({"nonce": nonce, **message}) + "\n").encode())

    with open(program_path, encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(source, "program.py", "exec")
    except (SyntaxError, ValueError) as e:
        send(error="syntax_error", detail=f"{type(e).__name__}: {e}")
        return 0
    namespace: dict[str, Any] = {"__name__": "__program__", "__builtins__": __builtins__}
    exec(code, namespace)  # an exception here ends the process: exit_1 with its traceback
    function = namespace.get(entry)
    if not callable(function):
        send(error="no_function", detail=f"the program defines no function {entry!r}")
        return 0
    for i, args in enumerate(cases):
        try:
            value = _encode(function(*args))
        except BaseException as e:  # sys.exit in a case fails that case only
            send(case=i, ok=False, detail=f"{type(e).__name__}: {e}"[:500])
            continue
        send(case=i, ok=True, value=value)
    return 0


def _encode(value: Any, depth: int = 0) -> Any:
    """Plain data as JSON with tags; exact built-in types only (no subclass, no __eq__)."""
    if depth > 100:
        raise ValueError("result nested too deeply")
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [_encode(v, depth + 1) for v in value]
    if kind in (tuple, set, frozenset):
        items = [_encode(v, depth + 1) for v in value]
        return {kind.__name__: items}
    if kind is dict:
        return {"dict": [[_encode(k, depth + 1), _encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    raise TypeError(f"returned a {kind.__name__}, not plain data")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    (tag, items), = value.items()
    if tag == "bytes":
        return bytes.fromhex(items)
    decoded = [_decode(v) for v in items]
    if tag == "tuple":
        return tuple(decoded)
    if tag == "set":
        return set(decoded)
    if tag == "frozenset":
        return frozenset(decoded)
    if tag == "dict":
        return dict(decoded)
    raise ValueError(f"unknown tag {tag!r}")


def _main(argv: list[str]) -> int:
    if argv[:1] == ["--launch"]:
        return _launch(json.loads(argv[1]))
    if argv[:1] == ["--guard"]:
        _install_guard(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--run"]:
        _run_guarded(argv[1])
        return 0
    if argv[:1] == ["--check"]:
        return _check(argv[1], argv[2], argv[3], int(argv[4]))
    print(f"sandbox.py: unknown arguments {argv!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
