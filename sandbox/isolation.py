"""Isolation: namespaces, the private root, the privilege drop, and pids cgroups.

Two sides of one job. The launcher runs as ``python -I -S -B isolation.py SPEC`` (started by
:mod:`astraflow.sandbox.process`; without site-packages, so it is stdlib only and imports
nothing of the project). With ``SPEC["isolate"]`` it enters new user, mount, network, PID,
IPC, UTS and cgroup namespaces (a helper left outside writes the user namespace's id maps:
real root maps ``0 -> 0`` for the mounts and ``65534 -> 65534`` for the program, anyone else
its own id to ``65534``), builds a tmpfs root of read-only binds and moves into it
(``pivot_root``), then forks the program, which sets its rlimits, gives up every capability,
becomes uid/gid 65534 and execs the interpreter. The caller's side, imported as a module,
creates and removes the run's v1 pids cgroup (as root).

It knows nothing about results, rewards or what the rlimits mean (it applies the numbers
it is given). What a run gets and what it does not stop: ``docs/security.md`` (Sandbox).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import secrets
import signal
import sys
import time
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
#: bound read-only as a whole (or linked, where the host links them)
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_PASSWD = f"nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin\n"
_GROUP = f"nogroup:x:{NOBODY}:\n"

#: libc for the system calls Python does not wrap (mount, unshare, pivot_root, prctl)
_libc: Any = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else os.fsencode(s) for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _set_attr(path: str, set_: int, clear: int = 0, recursive: bool = False) -> None:
    """``mount_setattr``: only adds or clears flags, so the locked ones of a host mount stay."""

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    attr = MountAttr(set_, clear, 0, 0)
    _check(_libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, os.fsencode(path), _AT_RECURSIVE if recursive else 0,
                         ctypes.byref(attr), ctypes.sizeof(attr)), f"mount_setattr {path}")


def _prctl(option: int, arg: int = 0, what: str = "prctl") -> None:
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

    for name in SYSTEM_DIRS:
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


# --- the caller's side: a pids cgroup per run ------------------------------------------------

_PIDS_HIERARCHY = "/sys/fs/cgroup/pids"  # cgroup v1; under v2 a delegated subtree is needed


def pids_cgroup(max_pids: int) -> str | None:
    """For root, a v1 pids cgroup per run where one is writable, holding at most ``max_pids``
    tasks: a second bound on the process count, and a way to kill what is left of a run
    without namespaces. None where there is none."""
    if os.geteuid() != 0 or not os.access(_PIDS_HIERARCHY, os.W_OK):
        return None
    _remove_stale_cgroups()
    path = os.path.join(_PIDS_HIERARCHY, f"astraflow-sandbox-{secrets.token_hex(8)}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(max_pids))
    except OSError:
        remove_cgroup(path)
        return None
    return path


def remove_cgroup(path: str) -> None:
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


# --- the launcher's entry ----------------------------------------------------------------------


if __name__ == "__main__":
    sys.exit(_launch(json.loads(sys.argv[1])))
