"""The sandbox's side of a run: launcher, namespaces, private root, audit hook, check harness.

Runs only as ``python -I -S -B sandbox_child.py --launch|--guard|--run|--check ...``: the
caller (:mod:`astraflow.workflows.sandbox`) copies this file into the run's directory, so
it is stdlib only and imports nothing of the project. It knows nothing about workflows,
rewards or training, and it is not imported by them either (the caller only reads
:data:`NOBODY` and the result encoding's tags).

``--launch SPEC`` is the launcher. With ``SPEC["isolate"]`` it builds the isolation the
caller's docstring describes, in this order:

1. A helper that stays in the caller's user namespace writes the id maps of the launcher's
   new user namespace (a process can map ids beyond its own only from outside). Real root
   maps ``0 -> 0`` (the launcher, to set up mounts) and ``65534 -> 65534`` (the program);
   any other user can map one id, its own, which becomes ``65534`` inside.
2. New mount, network, PID, IPC, UTS and cgroup namespaces; the launcher's child is PID 1.
3. PID 1 builds a root on a tmpfs: read-only binds of ``/usr`` (and ``/bin``, ``/lib*``,
   ``/sbin``, as links where the host has links), of the interpreter's install and of
   ``/etc/ld.so.cache``; a ``/dev`` with only ``null``, ``zero`` and ``urandom``; a fresh
   ``/proc`` of the new PID namespace; empty, small tmpfs ``/tmp`` and ``/run``; the run's
   directory read-only at its own path and its ``work/`` writable. Then ``pivot_root`` and
   the host's tree is detached: no other host path exists for the program.
4. PID 1 forks the program, which sets its rlimits, empties its capability bounding set,
   locks its securebits, drops its supplementary groups, becomes uid/gid 65534, sets
   no_new_privs and execs the interpreter: it holds no capability in any namespace.

Without ``isolate`` (the opt-in fallback) the program only gets the rlimits, the same
privilege drop where the caller is root (it can then not signal, read or write what only
root may), and, through ``--guard``, an audit hook in its interpreter.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import signal
import sys
from typing import Any

NOBODY = 65534  #: the uid and gid the program runs as (inside the namespace; on the host too as root)

_CLONE_NEWNS, _CLONE_NEWCGROUP, _CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
_CLONE_NEWIPC, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x08000000, 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE = 0x1000, 0x2000, 0x4000, 1 << 18
_MNT_DETACH = 2
_ATTR_RDONLY, _ATTR_NOSUID, _ATTR_NODEV, _ATTR_NOEXEC = 0x1, 0x2, 0x4, 0x8
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_SYS_MOUNT_SETATTR = 442  # the same number on x86_64 and in the generic table (arm64, riscv)
_SYS_PIVOT_ROOT = {"x86_64": 155, "i686": 217, "aarch64": 41, "riscv64": 41}.get(platform.machine(), 41)
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS = 1, 24, 28
_PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
#: NOROOT on, NO_SETUID_FIXUP off (so becoming 65534 clears every capability), KEEP_CAPS off,
#: NO_CAP_AMBIENT_RAISE on; each of them locked
_SECUREBITS = 0b11101011
_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_PASSWD = f"nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin\n"
_GROUP = f"nogroup:x:{NOBODY}:\n"

class _Libc:
    """libc, loaded on first use: only the launcher needs it, and a guarded program must not
    find it loaded in its own interpreter."""

    def __getattr__(self, name: str):
        import ctypes
        lib = ctypes.CDLL(None, use_errno=True)
        globals()["_libc"] = lib
        return getattr(lib, name)


_libc: Any = _Libc()


def _check(rc: int, what: str) -> None:
    if rc != 0:
        import ctypes
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    import ctypes
    enc = [None if s is None else os.fsencode(s) for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _set_attr(path: str, set_: int, clear: int = 0, recursive: bool = False) -> None:
    """``mount_setattr``: only adds or clears flags, so the locked ones of a host mount stay."""
    import ctypes

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    attr = MountAttr(set_, clear, 0, 0)
    _check(_libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, os.fsencode(path), _AT_RECURSIVE if recursive else 0,
                         ctypes.byref(attr), ctypes.sizeof(attr)), f"mount_setattr {path}")


def _prctl(option: int, arg: int = 0, what: str = "prctl") -> None:
    import ctypes
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), what)


# --- the launcher ----------------------------------------------------------------------


def _launch(spec: dict) -> int:
    """Isolate (``spec["isolate"]``), fork, limit, drop privileges and exec the program.

    Writes JSON lines to the report pipe: ``isolated``, then ``exit`` (``-signum`` when
    killed) and ``cpu_s`` of the program, or ``error``.
    """
    fd = spec["report_fd"]
    os.set_inheritable(fd, False)  # the program must not be able to write a fake exit

    def report(**message: Any) -> None:
        os.write(fd, (json.dumps(message) + "\n").encode())

    if spec["cgroup"]:
        try:  # "0" is this process; before any namespace
            with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as f:
                f.write("0")
        except OSError as e:
            report(error=f"cannot join {spec['cgroup']}: {e}")
            return 1
    if not spec["isolate"]:
        report(isolated=False)
        return _run_program(spec, report, isolated=False)
    try:
        _enter_namespaces(report)
        pid1 = os.fork()
    except OSError as e:
        report(error=f"cannot create the namespaces: {e}")
        return 1
    if pid1 == 0:  # PID 1 of the new PID namespace
        code = 1
        try:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, "pdeathsig")  # the launcher's death ends the namespace
            _private_root(spec)
            _check(_libc.sethostname(b"sandbox", 7), "sethostname")
            report(isolated=True)
            code = _run_program(spec, report, isolated=True)
        except BaseException as e:
            report(error=f"cannot build the sandbox's root: {e}")
        os._exit(code)
    _, status = os.waitpid(pid1, 0)
    return os.waitstatus_to_exitcode(status)


def _enter_namespaces(report) -> None:
    """A new user namespace with its id maps written from outside, then the others."""
    uid, gid = os.geteuid(), os.getegid()
    ready_r, ready_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(ready_w)
        code = 0
        if os.read(ready_r, 1):  # empty: the launcher failed to unshare and says so itself
            try:
                _write_id_maps(os.getppid(), uid, gid)
            except BaseException as e:
                report(error=f"cannot write the user namespace's id maps: {e}")
                code = 1
        os._exit(code)
    os.close(ready_r)
    try:
        _check(_libc.unshare(_CLONE_NEWUSER), "unshare user namespace")
        os.write(ready_w, b"1")
    finally:
        os.close(ready_w)
        _, status = os.waitpid(helper, 0)
    if status != 0:
        raise OSError("the id-map helper failed")
    _check(_libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
                         | _CLONE_NEWCGROUP), "unshare mount/network/pid/ipc/uts/cgroup namespaces")


def _write_id_maps(pid: int, uid: int, gid: int) -> None:
    def write(name: str, text: str) -> None:
        fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())  # one write: the kernel takes a map only whole
        finally:
            os.close(fd)

    if uid == 0:  # the launcher stays root inside to set up mounts; the program becomes 65534
        write("uid_map", f"0 0 1\n{NOBODY} {NOBODY} 1\n")
        write("gid_map", f"0 0 1\n{NOBODY} {NOBODY} 1\n")
    else:  # an ordinary user may map its own ids only, and must give up setgroups
        write("setgroups", "deny")
        write("uid_map", f"{NOBODY} {uid} 1\n")
        write("gid_map", f"{NOBODY} {gid} 1\n")


def _private_root(spec: dict) -> None:
    """In the new mount namespace: a root holding only what the interpreter needs."""
    root, work, new = spec["root"], spec["cwd"], spec["new_root"]
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here reaches the host
    _mount("tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m,nr_inodes=4096")

    def inside(path: str) -> str:
        return os.path.join(new, path.lstrip("/"))

    def bind(source: str, writable: bool = False, device: bool = False, recursive: bool = True) -> None:
        target = inside(source)
        if os.path.isdir(source):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        _mount(source, target, None, _MS_BIND | (_MS_REC if recursive else 0))
        attrs = _ATTR_NOSUID | (_ATTR_NOEXEC if device else _ATTR_NODEV) | (0 if writable else _ATTR_RDONLY)
        _set_attr(target, attrs, _ATTR_RDONLY if writable else 0, recursive=recursive)

    for name in _SYSTEM_DIRS:
        source = "/" + name
        if os.path.islink(source):
            os.symlink(os.readlink(source), inside(source))
        elif os.path.isdir(source):
            bind(source)
    for source in spec["binds"]:
        bind(source)
    os.makedirs(inside("/etc"), exist_ok=True)
    if os.path.isfile("/etc/ld.so.cache"):
        bind("/etc/ld.so.cache")
    for name, text in (("passwd", _PASSWD), ("group", _GROUP)):
        with open(inside(f"/etc/{name}"), "w") as f:
            f.write(text)
    os.mkdir(inside("/dev"))
    _mount("tmpfs", inside("/dev"), "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=16k,nr_inodes=32")
    for name in ("null", "zero", "urandom"):
        bind(f"/dev/{name}", device=True, recursive=False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, inside(f"/dev/{name}"))
    _set_attr(inside("/dev"), _ATTR_RDONLY)
    os.mkdir(inside("/proc"))
    _mount("proc", inside("/proc"), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    try:  # per user namespace: the program can create no nested one, hence no namespace at all
        with open(inside("/proc/sys/user/max_user_namespaces"), "w") as f:
            f.write("0")
    except OSError:
        pass  # a kernel without the per-namespace limit: nested ones are still unprivileged
    for path, options in (("/tmp", f"mode=1777,size={spec['tmp_kb']}k,nr_inodes=1024"),
                          ("/run", "mode=0755,size=16k,nr_inodes=32")):
        os.makedirs(inside(path), exist_ok=True)
        _mount("tmpfs", inside(path), "tmpfs", _MS_NOSUID | _MS_NODEV, options)
    bind(root, recursive=False)  # not recursive: new_root, inside it, stays an empty directory
    bind(work, writable=True, recursive=False)
    os.chdir(new)
    if _libc.syscall(_SYS_PIVOT_ROOT, b".", b".") == 0:
        _check(_libc.umount2(b".", _MNT_DETACH), "detach the host's root")
    else:  # a root that cannot be pivoted (an initramfs): move the new one over it and chroot
        _mount(new, "/", None, _MS_MOVE)
        os.chroot(".")
    os.chdir("/")
    _set_attr("/", _ATTR_RDONLY)


def _run_program(spec: dict, report, isolated: bool) -> int:
    try:
        pid = os.fork()
    except OSError as e:
        report(error=f"cannot fork the program: {e}")
        return 1
    if pid == 0:
        try:
            _become_program(spec, isolated)
            os.execve(spec["python"], [spec["python"], "-I", "-S", "-B", *spec["argv"]], spec["env"])
        except BaseException as e:
            report(error=f"cannot start the program: {e!r}")
        os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    report(exit=os.waitstatus_to_exitcode(status), cpu_s=usage.ru_utime + usage.ru_stime)
    return 0


def _become_program(spec: dict, isolated: bool) -> None:
    """Limits, then no capability and uid/gid 65534 (where the caller may give them away)."""
    for name, (soft, hard) in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, f"RLIMIT_{name}"), (soft, hard))
    os.chdir(spec["cwd"])
    privileged = isolated or os.geteuid() == 0  # holds capabilities now (in its namespace or on the host)
    if privileged:
        cap = 0
        while _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
            cap += 1  # EINVAL past the kernel's last capability ends the loop
        _prctl(_PR_SET_SECUREBITS, _SECUREBITS, "securebits")
        if os.geteuid() == 0:  # as an ordinary user's namespace, setgroups is denied and moot
            os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, "clear ambient capabilities")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1, "no_new_privs")


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
    if argv[:1] == ["--launch"]:
        return _launch(json.loads(argv[1]))
    if argv[:1] == ["--guard"]:
        _install_guard(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--run"]:
        _run_guarded(argv[1])
        return 0
    if argv[:1] == ["--check"]:
        return _run_checks(argv[1], argv[2], argv[3], int(argv[4]))
    print(f"sandbox_child.py: unknown arguments {argv!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
