"""A sandbox for model-written Python: run a program, or check a function against cases.

Owns the isolation of untrusted code and nothing else: :func:`run_python` runs a source
text in a separate, limited process and says how it ended; :func:`check_function` defines a
function from a program and calls it on test cases in one such process. It knows nothing
about workflows, rewards, Kafka or training. The sandbox's own side of a run (launcher,
namespaces, audit hook, check harness) is :mod:`astraflow.workflows.sandbox_child`.

Threat model: the program is hostile (a policy learns whatever raises its reward) and runs
on a machine whose caller may be real root, next to model caches, run directories, other
users' sockets and the Kafka cluster. What each run gets, where the kernel allows user
namespaces (probed once and cached, :func:`namespaces_available`):

1. **Not root, no capabilities.** The program runs as uid/gid 65534 of a new user namespace
   with no supplementary groups, an empty capability bounding set, locked securebits and
   no_new_privs. When the caller is root that id is the host's 65534 (``nobody``) too, so
   the kernel's own permission checks apply to it (RLIMIT_NPROC included); for any other
   caller it is the caller's own uid, which is all an unprivileged user can map.
2. **A private root.** A tmpfs root holding read-only ``/usr`` (``/bin``, ``/lib*``,
   ``/sbin``), the interpreter's install and ``/etc/ld.so.cache``; a ``/dev`` with only
   ``null``, ``zero`` and ``urandom``; a fresh ``/proc`` of its own PID namespace; empty,
   small ``/tmp`` and ``/run``; the run's directory read-only and its ``work/`` (the cwd)
   writable. No other host path exists inside, so ``/etc/shadow``, ``/root``, home
   directories, model caches, run directories, block devices, ``/dev/kmsg`` and every
   unix-domain socket on a host path are not there to open or connect to.
3. **No network.** A new network namespace has only a loopback device, down: every
   ``connect`` (127.0.0.1 is the namespace's own loopback, not the host's) and DNS lookup
   fails, abstract unix sockets of the host are in another namespace. ``RunResult.network_isolated``.
4. **Its own processes only.** New PID, IPC, UTS, mount and cgroup namespaces: host
   processes are invisible (no signal, no ptrace), hostname and mount changes (refused
   anyway without capabilities) stay inside, and when the program's main process ends
   (or the wall clock kills the launcher) the kernel kills everything left in the PID
   namespace, even processes that called ``setsid``.
5. **Limits** on the program process (``setrlimit`` before ``exec``): CPU seconds
   (``RLIMIT_CPU``, rounded up; the hard limit one second later), address space
   (``RLIMIT_AS``), file size (``RLIMIT_FSIZE``), no core files, and ``Limits.processes``
   tasks (threads count), itself included (``RLIMIT_NPROC``, counted per user namespace;
   an unprivileged caller's launcher and PID 1 share the program's count, hence ``+ 2``).
   As root, each run also gets a cgroup-v1 ``pids`` group where one is writable; after
   the run every task still in it is killed and the group removed.
6. **Wall clock**: after ``Limits.wall_s`` the whole process group is killed (SIGKILL), and
   the PID namespace with it.
7. **Environment**: ``python -I -S -B`` of the real interpreter behind
   :data:`sys.executable` (no site-packages, no ``PYTHON*`` variables), a minimal
   environment (PATH, HOME and TMPDIR in the work directory, a UTF-8 locale), a new session,
   a temporary run directory removed afterwards; stdout and stderr are kept up to
   ``Limits.output_kb`` each (the rest is read and dropped).

**Without namespaces** (an old kernel, a container whose seccomp profile refuses
``unshare``) untrusted code does not run: every run ends ``"no_isolation"`` (score 0) and
says how to opt in, :func:`configure` ``(allow_unisolated=True)``, which the components set
from the job config's ``sandbox.allow_unisolated``. Opted in, the program gets the limits,
the privilege drop to uid 65534 where the caller is root (then an interpreter others may
run is needed: the caller's, or ``/usr/bin/python3``), and an audit hook in its
interpreter that refuses writes outside the work directory, sockets, new programs,
signals to other processes than its own children and ctypes. Such a run says
``network_isolated=False``.

What this does NOT stop:

* Kernel exploits: there is no seccomp filter, and the whole kernel is reachable.
* Reading what the private root holds: the interpreter's install and ``/usr`` (world
  readable on any host), and the run's own files (program, cases).
* CPU time and memory are per process: a program that forks up to the process limit can
  use that many cores until the wall clock ends it, each with ``RLIMIT_AS`` of memory;
  ``/tmp`` and ``work/`` are bounded by their size limits, not by a disk quota.
* Without namespaces (opted in): the audit hook is a speed bump, not a wall (a C extension
  or ``_posixsubprocess`` goes around it). Every file ``nobody`` may read is readable and
  world-writable sockets are reachable; a caller that is not root gives the program its
  own uid, so files, processes and sockets of that user are open to it.
* :func:`check_function` runs its harness in the program's interpreter; results travel on
  a separate pipe, tagged with a nonce the program is not given, and are compared in the
  caller with ``==`` on plain data after a strict parse (a malformed tagged line scores the
  whole run 0, ``"malformed_results"``), so printing fake results or returning objects
  with a lying ``__eq__`` does not help. A program that searches its own interpreter for
  the harness's pipe and nonce (frames, ``gc``, re-reading its stdin) can forge results:
  this protects the caller, not the reward's honesty against a determined program.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from . import sandbox_child
from .sandbox_child import NOBODY

__all__ = ["Limits", "RunResult", "CheckResult", "run_python", "check_function",
           "namespaces_available", "configure", "unisolated_allowed"]

_log = logging.getLogger(__name__)
_CHILD = os.path.abspath(sandbox_child.__file__)
_CHILD_NAME = "sandbox_child.py"
_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
_RESULTS_CAP = 8 << 20  # bytes of check_function results kept (values can be large)
_PIDS_HIERARCHY = "/sys/fs/cgroup/pids"  # cgroup v1; under v2 a delegated subtree is needed
_GRACE_S = 2.0  # after the launcher ended or was killed: time to drain the pipes
_SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # bound as a whole
_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
_HARNESS_ERRORS = ("syntax_error", "no_function")
_REFUSAL = ("sandbox: this machine gives no user/mount/network namespaces, so model-written code does not "
            "run (score 0). To run it anyway with rlimits, an audit hook and uid 65534 only, set "
            "sandbox.allow_unisolated: true in the job config (docs/security.md, Sandbox)")
_settings = {"allow_unisolated": False}


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


@dataclass(frozen=True)
class RunResult:
    """How one sandboxed run ended.

    ``reason`` is one of ``"ok"``, ``"timeout"`` (wall clock), ``"cpu_limit"``,
    ``"memory_limit"`` (a ``MemoryError`` ended it), ``"file_limit"``, ``"crash"`` (SIGSEGV,
    SIGBUS, SIGILL, SIGFPE, SIGABRT), ``"exit_<code>"``, ``"signal_<NAME>"`` (any other
    signal), ``"no_isolation"`` (not run: no namespaces here and no opt-in) or
    ``"sandbox_error"`` (the sandbox itself failed; ``stderr`` says why).
    """

    ok: bool  #: exited 0 within every limit
    reason: str
    returncode: int | None  #: exit code, or minus the signal number; None on timeout/error
    stdout: str
    stderr: str
    duration_s: float
    network_isolated: bool  #: True when the child ran in its namespaces and private root


@dataclass(frozen=True)
class CheckResult:
    """The outcome of :func:`check_function`.

    ``reason`` is ``"ok"`` (every case passed), ``"wrong_answer"``, ``"syntax_error"``,
    ``"no_function"``, ``"malformed_results"`` (a line with the run's nonce that is not a
    well-formed result: every case fails), or the :class:`RunResult` reason when the process
    did not end well (cases that finished before a timeout keep their result).
    """

    passed: list[bool]  #: one per case; False for all when the program could not run
    reason: str
    detail: str = ""  #: the first failure, a traceback tail, or the syntax error


def configure(*, allow_unisolated: bool) -> None:
    """Process-wide policy, from the job config (``sandbox.allow_unisolated``): whether code
    runs where there are no namespaces (see the module docstring). Off by default."""
    if not isinstance(allow_unisolated, bool):
        raise TypeError(f"configure: allow_unisolated must be a bool, got {allow_unisolated!r}")
    _settings["allow_unisolated"] = allow_unisolated


def unisolated_allowed() -> bool:
    """Whether :func:`configure` opted in to runs without namespaces."""
    return _settings["allow_unisolated"]


@cache
def namespaces_available() -> bool:
    """Whether runs get their namespaces and private root here (probed once)."""
    result = _run(["-c", "pass"], stdin="", limits=Limits(), namespaces=True)
    if result.ok and result.network_isolated:
        return True
    why = _tail(result.stderr, 2) or result.reason
    _log.warning("sandbox: no user/mount/network namespaces here (%s); model-written code %s", why,
                 "runs with rlimits and an audit hook only (sandbox.allow_unisolated)" if unisolated_allowed()
                 else "does not run unless sandbox.allow_unisolated is set")
    return False


def _isolation() -> bool | None:
    """True: namespaces; False: the opted-in fallback; None: refuse to run."""
    if namespaces_available():
        return True
    return False if unisolated_allowed() else None


def run_python(source: str, *, stdin: str = "", limits: Limits = Limits()) -> RunResult:
    """Run ``source`` as a program in the sandbox, with ``stdin`` as its standard input."""
    if not isinstance(source, str):
        raise TypeError(f"run_python: source must be str, got {type(source).__name__}")
    isolated = _isolation()
    if isolated is None:
        return RunResult(False, "no_isolation", None, "", _REFUSAL, 0.0, False)
    return _run(["program.py"], stdin=stdin, limits=limits, files={"program.py": source}, namespaces=isolated)


def check_function(program: str, entry: str, cases: Sequence[tuple[Sequence[Any], Any]],
                   *, limits: Limits = Limits()) -> CheckResult:
    """Define ``program``, call ``entry(*args)`` for every ``(args, expected)`` case.

    All cases run in ONE sandboxed process. A case passes when the call returns plain data
    (None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset, nested) that
    equals ``expected`` (``==`` in the caller, so a tuple never equals a list); a case that
    raises, or returns anything else, fails. ``args`` must be picklable. Bad arguments of
    the caller raise ``ValueError``; nothing the program does makes this raise: every run
    is a result and a reason.
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
    failed = [False] * len(case_list)
    if not isinstance(program, str):
        return CheckResult(failed, "syntax_error", f"the program is a {type(program).__name__}, not text")
    isolated = _isolation()
    if isolated is None:
        return CheckResult(failed, "no_isolation", _REFUSAL)
    try:
        return _check(program, entry, case_list, cases_blob, limits, isolated)
    except Exception as e:  # a bug of ours must not fail the episode either: a score and a reason
        _log.exception("sandbox: check_function failed")
        return CheckResult(failed, "sandbox_error", f"{type(e).__name__}: {e}"[:500])


def _check(program: str, entry: str, case_list: list, cases_blob: bytes, limits: Limits,
           isolated: bool) -> CheckResult:
    nonce = secrets.token_hex(16)
    failed = [False] * len(case_list)
    run, lines = _run(["-", "--check", "program.py", entry, "cases.pkl"], stdin=nonce + "\n", limits=limits,
                      files={"program.py": program}, blobs={"cases.pkl": cases_blob}, namespaces=isolated,
                      with_results=True)
    got, error, malformed = _parse_results(lines, nonce, len(case_list))
    if malformed:
        return CheckResult(failed, "malformed_results", malformed)
    if error:
        return CheckResult(failed, *error)
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


def _parse_results(lines: list[str], nonce: str, n: int) -> tuple[dict[int, dict], tuple[str, str] | None, str]:
    """The harness's lines, strictly: per-case messages, a harness error, or why a line that
    carries the nonce is malformed (then nothing else counts). Lines without it are ignored."""
    got: dict[int, dict] = {}
    error = None
    for line in lines:
        if nonce not in line:
            continue
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as e:
            return {}, None, f"a results line is not JSON ({type(e).__name__}): {line[:120]!r}"
        if type(message) is not dict or message.get("nonce") != nonce:
            return {}, None, f"a results line is not a result: {line[:120]!r}"
        keys = set(message)
        if "error" in message:
            if keys - {"nonce", "error", "detail"} or message["error"] not in _HARNESS_ERRORS \
                    or type(message.get("detail", "")) is not str:
                return {}, None, f"a malformed harness error: {line[:120]!r}"
            error = error or (message["error"], message.get("detail", ""))
            continue
        case, ok = message.get("case"), message.get("ok")
        well_formed = (type(case) is int and 0 <= case < n and case not in got and type(ok) is bool
                       and (keys == {"nonce", "case", "ok", "value"} if ok else
                            keys == {"nonce", "case", "ok", "detail"} and type(message["detail"]) is str))
        if not well_formed:
            return {}, None, f"a malformed or repeated case result: {line[:120]!r}"
        got[case] = message
    return got, error, ""


def _judge(message: dict | None, expected: Any) -> tuple[bool, str]:
    if message is None:
        return False, "no result (the program ended first)"
    if not message["ok"]:
        return False, message["detail"][:500]
    try:
        value = _decode(message["value"])
        if value == expected:
            return True, ""
        return False, f"returned {_short(value)}, expected {_short(expected)}"
    except Exception as e:  # a malformed, or maliciously deep, value is the program's failure
        return False, f"unreadable result: {type(e).__name__}: {e}"[:500]


def _short(value: Any) -> str:
    try:
        return f"{value!r:.200}"
    except Exception as e:
        return f"<unprintable: {type(e).__name__}>"


def _decode(value: Any, depth: int = 0) -> Any:
    """The harness's tagged JSON back to plain data (:func:`sandbox_child.encode`), strictly."""
    if depth > sandbox_child.MAX_DEPTH:
        raise ValueError("result nested too deeply")
    if isinstance(value, list):
        return [_decode(v, depth + 1) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ValueError(f"a tagged value has {len(value)} keys")
    (tag, items), = value.items()
    if tag == "bytes":
        return bytes.fromhex(items)
    if not isinstance(items, list):
        raise ValueError(f"tag {tag!r} holds a {type(items).__name__}")
    decoded = [_decode(v, depth + 1) for v in items]
    if tag == "tuple":
        return tuple(decoded)
    if tag == "set":
        return set(decoded)
    if tag == "frozenset":
        return frozenset(decoded)
    if tag == "dict":
        return dict(decoded)
    raise ValueError(f"unknown tag {tag!r}")


def _tail(text: str, lines: int = 5) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# --- the caller's side of a run ----------------------------------------------------------


class _SetupError(Exception):
    """The sandbox cannot be set up for this run (its message says why)."""


def _run(args: list[str], *, stdin: str, limits: Limits, namespaces: bool,
         files: dict[str, str] | None = None, blobs: dict[str, bytes] | None = None,
         with_results: bool = False):
    """Run ``python -I -S -B *args`` in the sandbox; ``"-"`` in args is the sandbox's harness.

    ``namespaces`` False is the unisolated fallback (the callers decide; tests call it
    directly). Files land in the run's directory, read-only to the program, next to the
    writable ``work/`` directory (the program's cwd); the directory has the same path inside
    the sandbox as outside. Returns the :class:`RunResult`, and with ``with_results`` also
    the lines the program's child wrote on the results pipe (its fd number is appended to
    args).
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
            return _error(f"sandbox: {e}", start, with_results)
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
        child = os.path.join(root, _CHILD_NAME)
        program_args = [child if a == "-" else os.path.join(root, a) if a in named else a for a in args]
        if with_results:
            results_r, results_w = os.pipe()
            fds += [results_r, results_w]
            program_args.append(str(results_w))
        if not namespaces:
            program_args = _guarded(program_args, child, work)
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
               "LC_ALL": "C.UTF-8"}
        cgroup = _pids_cgroup(limits)
        spec = {"argv": program_args, "cwd": work, "env": env, "report_fd": report_w, "isolate": namespaces,
                "root": root, "new_root": os.path.join(root, ".root"), "binds": binds, "python": python,
                "tmp_kb": int(4 * limits.file_mb * 1024) + 64, "cgroup": cgroup,
                "rlimits": _rlimits(limits, namespaces)}
        launcher = [sys.executable, "-I", "-S", "-B", child, "--launch", json.dumps(spec)]
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
            lines = data["results"].decode("utf-8", "replace").split("\n")
            if truncated["results"]:
                lines.pop()  # cut at the cap: a partial line, not a malformed one
            return result, lines
        return result
    finally:
        for fd in fds:
            os.close(fd)
        _remove_tree(root)
        if cgroup:
            _remove_cgroup(cgroup)


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
    cpu = max(1, math.ceil(limits.cpu_s))
    memory = int(limits.memory_mb * 1024 * 1024)
    size = int(limits.file_mb * 1024 * 1024)
    as_root = os.geteuid() == 0
    if namespaces:  # counted per user namespace; an ordinary user's launcher and PID 1 share the count
        nproc = limits.processes + (0 if as_root else 2)
    else:  # counted across the host, for the uid the program runs as
        nproc = _user_tasks(NOBODY if as_root else os.getuid()) + limits.processes
    return {"CPU": [cpu, cpu + 1], "AS": [memory, memory], "FSIZE": [size, size],
            "NPROC": [nproc, nproc], "CORE": [0, 0]}


def _pids_cgroup(limits: Limits) -> str | None:
    """For root, a v1 pids cgroup per run where one is writable: a second bound on the
    process count, and a way to kill what is left of a run without namespaces."""
    if os.geteuid() != 0 or not os.access(_PIDS_HIERARCHY, os.W_OK):
        return None
    _remove_stale_cgroups()
    path = os.path.join(_PIDS_HIERARCHY, f"astraflow-sandbox-{secrets.token_hex(8)}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(limits.processes + 3))  # the launcher, its id-map helper and PID 1 join it too
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


def _guarded(program_args: list[str], child: str, work: str) -> list[str]:
    """Without namespaces: start the program behind the sandbox's audit hook."""
    if program_args[0] == child:  # the harness: the hook goes in before it
        return [child, "--guard", work, *program_args[1:]]
    return [child, "--guard", work, "--run", *program_args]


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
        try:  # only the launcher holds this pipe; still, nothing on it may raise here
            message = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if type(message) is dict:
            report.update(message)
    duration = time.monotonic() - start
    isolated = namespaces and report.get("isolated") is True

    def done(reason: str, code: int | None, err: str = stderr) -> RunResult:
        return RunResult(reason == "ok", reason, code, stdout, err, duration, isolated)

    if timed_out:
        return done("timeout", None)
    if "error" in report or "exit" not in report:
        why = report.get("error") or "the launcher ended without reporting the program's exit"
        return done("sandbox_error", None, f"sandbox: {why}\n{stderr}")
    code = report["exit"]
    if type(code) is not int:
        return done("sandbox_error", None, f"sandbox: the launcher reported exit {code!r:.40}\n{stderr}")
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
