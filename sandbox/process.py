"""The caller's side of one run: the run's directory, the launcher process, limits, timeouts, killing.

:func:`run` writes the program and its inputs into a fresh directory (open to uid 65534
where the caller is root), picks the interpreter and the host trees the private root binds,
starts the launcher (:mod:`astraflow.sandbox.isolation`) in a new session with the run's
rlimits, reads its stdout, stderr, report and results pipes up to their caps until it ends
or the wall clock runs out, kills the whole process group, and removes the directory and
the run's cgroup. It returns an :class:`Outcome`: what the run left behind, not a verdict
(:mod:`astraflow.sandbox.results` reads one). It knows nothing about rewards, cases or
whether unisolated runs are allowed (:mod:`astraflow.sandbox.api` decides that).
"""

from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import child, isolation
from .isolation import NOBODY

_CHILD = os.path.abspath(child.__file__)
_CHILD_NAME = "child.py"
_LAUNCHER = os.path.abspath(isolation.__file__)
_RESULTS_CAP = 8 << 20  # bytes of check_function results kept (values can be large)
_GRACE_S = 2.0  # after the launcher ended or was killed: time to drain the pipes
_SYSTEM_TREES = tuple("/" + name for name in isolation.SYSTEM_DIRS)  # bound as a whole
_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use."""

    cpu_s: float = 2.0  #: CPU seconds of the program process (RLIMIT_CPU, rounded up)
    wall_s: float = 5.0  #: wall-clock seconds, then the whole process group is killed
    memory_mb: int = 256  #: address space of each process (RLIMIT_AS)
    processes: int = 32  #: tasks (threads too) the program may have, itself included
    file_mb: float = 1.0  #: largest file the program may write (RLIMIT_FSIZE); /tmp holds 4 of them
    output_kb: int = 64  #: stdout and stderr kept, each

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_mb", "processes", "file_mb", "output_kb"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                    or not value > 0:
                raise ValueError(f"Limits.{name} must be a positive finite number, got {value!r}")

    @property
    def cpu_seconds(self) -> int:
        """``cpu_s`` as RLIMIT_CPU takes it: whole seconds, rounded up, at least one."""
        return max(1, math.ceil(self.cpu_s))


class Outcome(NamedTuple):
    """What one run left behind, before any verdict."""

    stdout: str  #: kept up to ``Limits.output_kb``, then ``[output truncated]``
    stderr: str  #: the same
    report: dict[str, Any]  #: the launcher's report: ``isolated``, ``exit``, ``cpu_s`` or ``error``
    timed_out: bool  #: the wall clock ended it
    duration_s: float
    results: list[str]  #: the lines of the results pipe (``with_results``)
    setup_error: str = ""  #: why the run could not start (then nothing else is set)


class _SetupError(Exception):
    """The sandbox cannot be set up for this run (its message says why)."""


def run(args: list[str], *, stdin: str, limits: Limits, namespaces: bool,
        files: dict[str, str] | None = None, blobs: dict[str, bytes] | None = None,
        with_results: bool = False) -> Outcome:
    """Run ``python -I -S -B *args`` in the sandbox; ``"-"`` in args is :mod:`~astraflow.sandbox.child`.

    ``namespaces`` False is the unisolated fallback (the caller decides). Files land in the
    run's directory, read-only to the program, next to the writable ``work/`` directory (the
    program's cwd); the directory has the same path inside the sandbox as outside. With
    ``with_results`` the program's child gets a results pipe (its fd number is appended to
    args) and :attr:`Outcome.results` holds its lines.
    """
    start = time.monotonic()
    root = tempfile.mkdtemp(prefix="astraflow-sandbox-")
    work = os.path.join(root, "work")
    fds: list[int] = []
    cgroup = None
    try:
        as_root = os.geteuid() == 0
        try:
            python, binds = _interpreter(namespaces, as_root)
        except _SetupError as e:
            return _failed(f"sandbox: {e}", start)
        os.mkdir(work)
        os.mkdir(os.path.join(root, ".root"))  # the private root's mount point (namespaces)
        shutil.copyfile(_CHILD, os.path.join(root, _CHILD_NAME))
        for name, text in (files or {}).items():
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        for name, data in (blobs or {}).items():
            with open(os.path.join(root, name), "wb") as f:
                f.write(data)
        with open(os.path.join(root, "stdin"), "w", encoding="utf-8") as f:
            f.write(stdin)
        _open_to_the_program(root, work, as_root)
        report_r, report_w = os.pipe()
        fds += [report_r, report_w]
        results_r = results_w = None
        named = {**(files or {}), **(blobs or {})}
        child_path = os.path.join(root, _CHILD_NAME)
        program_args = [child_path if a == "-" else os.path.join(root, a) if a in named else a for a in args]
        if with_results:
            results_r, results_w = os.pipe()
            fds += [results_r, results_w]
            program_args.append(str(results_w))
        if not namespaces:
            program_args = _guarded(program_args, child_path, work)
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
               "LC_ALL": "C.UTF-8"}
        cgroup = isolation.pids_cgroup(limits.processes + 3)  # the launcher, its id-map helper and PID 1 join it too
        spec = {"argv": program_args, "cwd": work, "env": env, "report_fd": report_w, "isolate": namespaces,
                "root": root, "new_root": os.path.join(root, ".root"), "binds": binds, "python": python,
                "tmp_kb": int(4 * limits.file_mb * 1024) + 64, "cgroup": cgroup,
                "rlimits": _rlimits(limits, namespaces)}
        launcher = [sys.executable, "-I", "-S", "-B", _LAUNCHER, json.dumps(spec)]
        passed = tuple(fd for fd in (report_w, results_w) if fd is not None)
        with open(os.path.join(root, "stdin"), "rb") as stdin_file:
            try:
                proc = subprocess.Popen(launcher, stdin=stdin_file, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, pass_fds=passed, cwd=root,
                                        env=env, start_new_session=True)
            except OSError as e:
                return _failed(f"sandbox: cannot start {launcher[0]}: {e}", start)
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
        lines: list[str] = []
        if with_results:
            lines = data["results"].decode("utf-8", "replace").split("\n")
            if truncated["results"]:
                lines.pop()  # cut at the cap: a partial line, not a malformed one
        return Outcome(_text(data, truncated, "stdout"), _text(data, truncated, "stderr"), _report(data["report"]),
                       timed_out, time.monotonic() - start, lines)
    finally:
        for fd in fds:
            os.close(fd)
        _remove_tree(root)
        if cgroup:
            isolation.remove_cgroup(cgroup)


def _interpreter(namespaces: bool, as_root: bool) -> tuple[str, list[str]]:
    """The interpreter the program runs on, and the host directories it needs bound.

    With namespaces: the real interpreter behind :data:`sys.executable` (a venv is no use
    with ``-S``) and its install, bound at their own paths. Without, as root: one that uid
    65534 may run, since the program becomes that uid.
    """
    python = os.path.realpath(sys.executable)
    if namespaces:
        trees = sorted({os.path.realpath(sys.base_prefix), os.path.dirname(python)}, key=len)
        binds: list[str] = []
        for tree in trees:
            if not any(tree == t or tree.startswith(t + "/") for t in (*_SYSTEM_TREES, *binds)):
                binds.append(tree)
        return python, binds
    if not as_root:
        return python, []
    own = (python, os.path.realpath(sys.base_prefix))
    if all(_others_may_enter(p) for p in own):
        return python, []
    for candidate in _SYSTEM_PYTHONS:
        real = os.path.realpath(candidate)
        if os.path.isfile(real) and _others_may_enter(real):
            return real, []
    raise _SetupError(f"without namespaces the program runs as uid {NOBODY}, which may not run {python} (a "
                      f"directory on its path is closed to other users) and there is no {_SYSTEM_PYTHONS[0]}")


def _others_may_enter(path: str) -> bool:
    """Whether every directory down to ``path``, and ``path`` itself, is open to other users."""
    path = os.path.realpath(path)
    while True:
        try:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        if path == "/":
            return True
        path = os.path.dirname(path)


def _open_to_the_program(root: str, work: str, as_root: bool) -> None:
    """As root the program is uid 65534: it may enter the run's directory (not list it), read
    its files, and own ``work/``."""
    if not as_root:
        return
    os.chmod(root, 0o711)
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isfile(path):
            os.chmod(path, 0o644)
    os.chown(work, NOBODY, NOBODY)


def _rlimits(limits: Limits, namespaces: bool) -> dict[str, list[int]]:
    cpu = limits.cpu_seconds
    memory = int(limits.memory_mb * 1024 * 1024)
    size = int(limits.file_mb * 1024 * 1024)
    as_root = os.geteuid() == 0
    if namespaces:  # counted per user namespace; an ordinary user's launcher and PID 1 share the count
        nproc = limits.processes + (0 if as_root else 2)
    else:  # counted across the host, for the uid the program runs as
        nproc = _user_tasks(NOBODY if as_root else os.getuid()) + limits.processes
    return {"CPU": [cpu, cpu + 1], "AS": [memory, memory], "FSIZE": [size, size],
            "NPROC": [nproc, nproc], "CORE": [0, 0]}


def _user_tasks(uid: int) -> int:
    """Tasks (threads included) of ``uid`` now: what RLIMIT_NPROC counts."""
    total = 0
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


def _guarded(program_args: list[str], child_path: str, work: str) -> list[str]:
    """Without namespaces: start the program behind the sandbox's audit hook."""
    if program_args[0] == child_path:  # the harness: the hook goes in before it
        return [child_path, "--guard", work, *program_args[1:]]
    return [child_path, "--guard", work, "--run", *program_args]


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


def _text(data: dict[str, bytearray], truncated: dict[str, bool], name: str) -> str:
    out = bytes(data[name]).decode("utf-8", "replace")
    return out + "\n[output truncated]" if truncated[name] else out


def _report(raw: bytearray) -> dict[str, Any]:
    """The launcher's JSON lines, merged. Only the launcher holds this pipe; still, nothing on
    it may raise here."""
    report: dict[str, Any] = {}
    for line in bytes(raw).decode("utf-8", "replace").splitlines():
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if type(message) is dict:
            report.update(message)
    return report


def _failed(message: str, start: float) -> Outcome:
    return Outcome("", "", {}, False, time.monotonic() - start, [], setup_error=message)


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
