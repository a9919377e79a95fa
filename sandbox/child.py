"""The code that runs inside the program's interpreter: the audit hook and the check harness.

Runs only as ``python -I -S -B child.py [--guard WORK] --run PROGRAM | --check PROGRAM ENTRY
CASES RESULTS_FD``, started by the launcher (:mod:`astraflow.sandbox.isolation`) as the
program itself: the caller (:mod:`astraflow.sandbox.process`) copies this file into the run's
directory, so it is stdlib only, imports nothing of the project and never loads ctypes.

``--guard`` puts an audit hook in before the program (the opted-in fallback without
namespaces); ``--check`` defines the program and writes one tagged JSON line per case on the
results pipe (:func:`encode`; the caller decodes and judges them, :mod:`astraflow.sandbox.results`).
It knows nothing about namespaces, limits, rewards or how a verdict is reached. What the hook
and the harness do and do not stop: ``docs/security.md`` (Sandbox).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# --- the audit hook (without namespaces) -------------------------------------------------

_REFUSED_EVENTS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
                   "os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn",
                   "os.startfile", "pty.spawn", "os.killpg", "signal.pthread_kill", "ctypes.dlopen",
                   "ctypes.dlsym", "ctypes.call_function", "ctypes.cdata", "socket.sethostname"}
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link",
                "os.truncate", "os.chmod", "os.chown", "shutil.rmtree", "os.utime"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _install_guard(work: str) -> None:
    """Without namespaces: refuse writes outside ``work``, sockets, new programs, signals to
    other processes than the program's own children, and loading C code through ctypes."""
    work = os.path.realpath(work)
    me = os.getpid()

    def outside(path: Any) -> bool:
        if isinstance(path, int) or path is None:
            return False  # an fd: already open
        real = os.path.realpath(os.fsdecode(path))
        return real != work and not real.startswith(work + os.sep)

    def own_child(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                return int(f.read().rsplit(b")", 1)[1].split()[1]) == me
        except (OSError, ValueError, IndexError):
            return False

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
        elif event == "os.kill":
            pid = args[0]
            if pid != me and not (isinstance(pid, int) and pid > 0 and own_child(pid)):
                raise PermissionError(f"sandbox: os.kill of process {pid} is not allowed")
        elif event in _REFUSED_EVENTS:
            raise PermissionError(f"sandbox: {event} is not allowed")

    sys.addaudithook(hook)


def _run_guarded(program: str) -> None:
    import runpy

    sys.argv = [program]
    runpy.run_path(program, run_name="__main__")


# --- the check harness ------------------------------------------------------------------


def _run_checks(program_path: str, entry: str, cases_path: str, results_fd: int) -> int:
    """The harness: define the program, run each case, write one result line per case."""
    import pickle

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
            value = encode(function(*args))
        except BaseException as e:  # sys.exit in a case fails that case only
            send(case=i, ok=False, detail=f"{type(e).__name__}: {e}"[:500])
            continue
        send(case=i, ok=True, value=value)
    return 0


MAX_DEPTH = 100  #: deepest nesting of a result value, both ways


def encode(value: Any, depth: int = 0) -> Any:
    """Plain data as JSON with tags; exact built-in types only (no subclass, no __eq__)."""
    if depth > MAX_DEPTH:
        raise ValueError("result nested too deeply")
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    raise TypeError(f"returned a {kind.__name__}, not plain data")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--guard"]:
        _install_guard(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--run"]:
        _run_guarded(argv[1])
        return 0
    if argv[:1] == ["--check"]:
        return _run_checks(argv[1], argv[2], argv[3], int(argv[4]))
    print(f"child.py: unknown arguments {argv!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
