"""The code sandbox against an attacker: each attack of the audit (issue 29), contained, with
the reason the run records.

Every attack is a real program in the real sandbox. What it aims at is the test's own: a
socket in a temp dir the test made, a ``sleep`` process the test started as the victim of
kills, the host's hostname set to the value it already has, a mount over the sandbox's own
work dir; block devices and ``/dev/kmsg`` are only opened for writing, never written. So
no attack harms the host even where the sandbox failed to stop it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

from astraflow.config import JobConfig
from astraflow.typed_config import ConfigError, from_dict
from astraflow import sandbox
from astraflow.sandbox import Limits, check_function, namespaces_available, run_python
from astraflow.sandbox.api import _run
from astraflow.workflows.code_tasks import ENTRY, program_of

SMALL = Limits(cpu_s=1, wall_s=20, memory_mb=128, processes=16, file_mb=0.1, output_kb=8)
CASES = [((1,), 2), ((2,), 3), ((5,), 6)]
needs_namespaces = pytest.mark.skipif(not namespaces_available(), reason="no user/network/mount namespaces here")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="what the sandbox takes away from a root caller")
pytestmark = pytest.mark.usefixtures("no_sandbox_leftovers")

#: prints one JSON line per attempt: [what, "ok"] or [what, error name, strerror]
ATTEMPT = """
import json, os, sys
def attempt(what, action):
    try:
        action()
        print(json.dumps([what, "ok"]))
    except Exception as e:
        print(json.dumps([what, type(e).__name__, getattr(e, "strerror", None) or str(e)]))
"""


def attempts(source: str, namespaces: bool = True) -> tuple[sandbox.RunResult, dict[str, list]]:
    program = ATTEMPT + textwrap.dedent(source)
    if namespaces:
        result = run_python(program, limits=SMALL)
    else:
        result = _run(["program.py"], stdin="", limits=SMALL, files={"program.py": program}, namespaces=False)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("[")]
    return result, {line[0]: line[1:] for line in lines}


@pytest.fixture
def victim():
    """A host process of the test's own user that attacks try to kill."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def block_devices(limit: int = 3) -> list[str]:
    found = []
    for name in sorted(os.listdir("/dev")):
        try:
            if stat.S_ISBLK(os.stat(f"/dev/{name}").st_mode):
                found.append(f"/dev/{name}")
        except OSError:
            continue
    return found[:limit]


# --- with namespaces: the program is uid 65534, in a private root ------------------------------


@needs_namespaces
def test_the_program_is_not_root_and_holds_no_capability():
    result, got = attempts("""
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    print(json.dumps(["ids", os.getuid(), os.geteuid(), os.getgid(), os.getgroups()]))
    print(json.dumps(["caps", [status[k].strip() for k in ("CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")]]))
    print(json.dumps(["uid_map", open("/proc/self/uid_map").read().split()]))
    attempt("setuid 0", lambda: os.setuid(0))
    """)
    assert result.reason == "ok" and result.network_isolated
    assert got["ids"][:3] == [65534, 65534, 65534]
    if os.geteuid() == 0:  # an ordinary user's namespace keeps (unmapped) supplementary groups
        assert got["ids"][3] == []
    assert got["caps"] == [["0000000000000000"] * 4 + ["1"]]
    inside, outside, _ = got["uid_map"][0][-3:]  # its own id, and whom the host sees
    assert inside == "65534" and int(outside) == (65534 if os.geteuid() == 0 else os.getuid())
    assert got["setuid 0"] == ["PermissionError", "Operation not permitted"]


def interpreter_path() -> list[str]:
    """The directories down to the interpreter's install: the one host path of the private
    root besides /usr and the run's directory."""
    real = os.path.realpath(sys.base_prefix).strip("/").split("/")
    return ["/" + "/".join(real[:i]) for i in range(1, len(real) + 1)]


@needs_namespaces
def test_host_secrets_and_the_callers_files_are_not_there():
    from astraflow.models.bootstrap import cache_root

    on_the_way = interpreter_path()
    secrets = ["/etc/shadow", "/etc/hostname", os.getcwd(), str(cache_root()),
               tempfile.gettempdir() + "/pytest-of-root",
               "/work", "/sys/kernel", "/var", "/home", os.path.expanduser("~")]
    if os.access("/root", os.R_OK):  # root's home: its model cache, keys, config
        secrets += [os.path.join("/root", name) for name in os.listdir("/root")]
    secrets = [p for p in dict.fromkeys(secrets) if os.path.exists(p) and p not in on_the_way]
    result, got = attempts(f"""
    for path in {secrets!r}:
        attempt(path, lambda: os.listdir(path) if os.path.isdir(path) else open(path, "rb").read())
    print(json.dumps(["/", sorted(os.listdir("/"))]))
    """)
    assert result.reason == "ok" and len(secrets) >= 5
    for path in secrets:
        assert got[path][0] == "FileNotFoundError", (path, got[path])
    assert set(got["/"][0]) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin",
                                "tmp", "usr", on_the_way[0].strip("/")}


@needs_namespaces
def test_a_40_character_completion_on_the_reward_path_reads_nothing():
    """The real reward path: an expression becomes ``def f(x): return <expr>``."""
    for expr, error in (("open('/etc/shadow').read()", "FileNotFoundError"),
                        ("__import__('os').listdir('/home')", "FileNotFoundError"),
                        ("__import__('os').open('/dev/kmsg',1)", "FileNotFoundError"),
                        ("open('/proc/1/environ').read()", "PermissionError")):  # PID 1 of its namespace
        assert len(expr) <= 40
        result = check_function(program_of(expr, 1), ENTRY, CASES, limits=SMALL)
        assert result.passed == [False] * 3 and result.reason == "wrong_answer"
        assert result.detail.startswith(f"case 0: {error}"), (expr, result.detail)


@needs_namespaces
def test_dev_holds_null_zero_urandom_only_and_no_device_opens_for_writing():
    devices = ["/dev/kmsg", *block_devices()]
    result, got = attempts(f"""
    import stat
    print(json.dumps(["dev", sorted(os.listdir("/dev"))]))
    for path in {devices!r}:
        attempt(path, lambda: os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK)))
    attempt("write null", lambda: open("/dev/null", "w").write("x"))
    attempt("read urandom", lambda: len(open("/dev/urandom", "rb").read(16)) == 16 or 1 / 0)
    attempt("read zero", lambda: open("/dev/zero", "rb").read(4) == bytes(4) or 1 / 0)
    attempt("mknod", lambda: os.mknod("node", 0o600 | stat.S_IFBLK, os.makedev(7, 0)))
    """)
    assert result.reason == "ok"
    assert got["dev"] == [["fd", "null", "stderr", "stdin", "stdout", "urandom", "zero"]]
    for path in devices:
        assert got[path][0] == "FileNotFoundError", (path, got[path])
    assert got["write null"] == got["read urandom"] == got["read zero"] == ["ok"]
    assert got["mknod"][0] == "PermissionError"


@needs_namespaces
def test_no_host_socket_of_any_family_is_reachable():
    """A unix socket on a host path (in the test's own temp dir, open to everyone), an
    abstract one and a TCP one: the test itself reaches each; the program reaches none."""
    directory = tempfile.mkdtemp(prefix="astraflow-test-socket-")
    path = os.path.join(directory, "host.sock")
    abstract = "\0astraflow-test-" + os.path.basename(directory)
    servers = []
    try:
        os.chmod(directory, 0o755)
        for address, family in ((path, socket.AF_UNIX), (abstract, socket.AF_UNIX), (("127.0.0.1", 0), socket.AF_INET)):
            server = socket.socket(family)
            server.bind(address)
            server.listen()
            server.settimeout(0.2)
            servers.append(server)
        os.chmod(path, 0o777)
        tcp = servers[2].getsockname()
        for server in servers:  # the control: each one is live and reachable from the host
            probe = socket.socket(server.family)
            probe.connect(server.getsockname())
            server.accept()[0].close()
            probe.close()
        result, got = attempts(f"""
        import socket
        def connect(family, address):
            s = socket.socket(family)
            s.settimeout(1)
            s.connect(address)
        attempt("path", lambda: connect(socket.AF_UNIX, {path!r}))
        attempt("abstract", lambda: connect(socket.AF_UNIX, {abstract!r}))
        attempt("tcp", lambda: connect(socket.AF_INET, {tuple(tcp)!r}))
        attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
        """)
        assert result.reason == "ok"
        assert got["path"][0] == "FileNotFoundError"
        assert got["abstract"][0] == "ConnectionRefusedError"
        assert got["tcp"][0] in ("OSError", "ConnectionRefusedError")  # ENETUNREACH: loopback is down
        assert got["dns"][0] == "gaierror"
        for server in servers:
            with pytest.raises(TimeoutError):
                server.accept()
    finally:
        for server in servers:
            server.close()
        shutil.rmtree(directory)


@needs_namespaces
def test_the_program_cannot_signal_its_parent_or_any_host_process(victim):
    result, got = attempts(f"""
    import signal, time
    attempt("kill host process", lambda: os.kill({victim.pid}, signal.SIGKILL))
    attempt("kill parent", lambda: os.kill(os.getppid(), signal.SIGKILL))
    time.sleep(0.2)
    print(json.dumps(["parent", os.getppid()]))
    """)
    assert result.reason == "ok" and victim.poll() is None  # the victim lives
    assert got["kill host process"][0] == "ProcessLookupError"  # not in its PID namespace
    assert got["parent"] == [1]  # PID 1 of the namespace: another uid (and init, which ignores SIGKILL)
    assert got["kill parent"] == ["PermissionError", "Operation not permitted"]


@needs_namespaces
def test_mount_hostname_and_namespace_changes_are_refused():
    host = socket.gethostname()
    result, got = attempts(f"""
    import ctypes, socket
    libc = ctypes.CDLL(None, use_errno=True)
    def call(rc):
        if rc != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    attempt("mount", lambda: call(libc.mount(b"tmpfs", os.getcwd().encode(), b"tmpfs", 0, None)))
    attempt("remount /usr", lambda: call(libc.mount(None, b"/usr", None, 0x20 | 0x1000, None)))
    attempt("sethostname", lambda: socket.sethostname({host!r}))  # the host's own name: a no-op if it got out
    attempt("unshare user", lambda: call(libc.unshare(0x10000000)))
    attempt("unshare mount", lambda: call(libc.unshare(0x00020000)))
    print(json.dumps(["hostname", socket.gethostname()]))
    """)
    assert result.reason == "ok"
    assert got["mount"] == got["remount /usr"] == got["sethostname"] == got["unshare mount"] == [
        "PermissionError", "Operation not permitted"]
    assert got["unshare user"][0] in ("OSError", "PermissionError")  # ENOSPC: no nested user namespace
    assert got["hostname"] == ["sandbox"] and socket.gethostname() == host


# --- garbage on the results pipe: a score and a reason, never an exception -------------------

FORGER = """
import os, sys
def f(x):
    return x + 1
nonce = os.pread(0, 32, 0).decode()  # the harness read it from stdin; a file can be read again
os.write(int(sys.argv[-1]), (LINE.replace("NONCE", nonce) + "\\n").encode())
"""


@pytest.mark.parametrize("line", [
    "NONCE not json",
    '{"nonce": "NONCE", "case": 0, "ok": true, "value": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"nonce": "NONCE", "error": ' + "[" * 5_000 + "]" * 5_000 + "}",
    '{"nonce": "NONCE", "error": "no_function", "detail": ' + "[" * 500 + "]" * 500 + "}",
    '{"nonce": "NONCE", "case": [0], "ok": true, "value": 1}',
    '{"nonce": "NONCE", "case": true, "ok": true, "value": 3}',
    '{"nonce": "NONCE", "case": 0, "ok": "yes", "value": 2}',
    '{"nonce": "NONCE", "case": 0, "ok": false, "detail": {"x": 1}}',
    '{"nonce": "NONCE", "case": 99, "ok": true, "value": 1}',
    '["NONCE"]',
], ids=["text", "deep-value", "deep-error", "deep-detail", "list-case", "bool-case", "str-ok", "dict-detail",
        "case-out-of-range", "not-a-mapping"])
def test_garbage_on_the_results_pipe_scores_zero_with_its_reason(line):
    program = FORGER.replace("LINE", repr(line))
    result = check_function(program, "f", CASES, limits=SMALL)
    assert result.passed == [False] * 3 and result.reason == "malformed_results", result


def test_well_formed_lines_with_values_the_caller_cannot_read_fail_their_cases():
    """One forged line per case, then the program ends before the harness sends its own
    (a second line for a case would be malformed)."""
    deep = "[" * 150 + "]" * 150  # valid JSON, deeper than any value the harness sends
    forged = [('{"nonce": "NONCE", "case": 0, "ok": true, "value": ' + deep + "}"),
              '{"nonce": "NONCE", "case": 1, "ok": true, "value": {"dict": 5}}',
              '{"nonce": "NONCE", "case": 2, "ok": true, "value": {"set": [[1]]}}']  # unhashable in a set
    program = "import os, sys\nnonce = os.pread(0, 32, 0).decode()\n" + "".join(
        f"os.write(int(sys.argv[-1]), ({line!r}.replace('NONCE', nonce) + '\\n').encode())\n" for line in forged
    ) + "os._exit(0)\n"
    result = check_function(program, "f", CASES, limits=SMALL)
    assert result.passed == [False] * 3 and result.reason == "wrong_answer"
    assert result.detail.startswith("case 0: unreadable result: ValueError")


def test_garbage_without_the_nonce_is_ignored():
    program = ("import os, sys\nos.write(int(sys.argv[-1]), b'\\xff\\xfe{]' + b'[' * 10**6 + b'\\n')\n"
               "print('{\"case\": 0}')\ndef f(x):\n    return x + 1\n")
    assert check_function(program, "f", CASES, limits=SMALL) == sandbox.CheckResult([True] * 3, "ok")


def test_a_deeply_nested_return_value_fails_its_case():
    program = ("def f(x):\n    v = x + 1\n    for _ in range(10_000):\n        v = [v]\n"
               "    return v if x == 1 else x + 1")
    result = check_function(program, "f", CASES, limits=SMALL)
    assert result.passed == [False, True, True] and "nested too deeply" in result.detail


# --- without namespaces: refused unless configured, then never root ----------------------------

SECCOMP_NO_UNSHARE = r"""
import ctypes, json, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
# A filter like a container runtime's default: unshare(2) fails with EPERM, as where the
# kernel gives no namespaces. x86_64 only (the arch check lets everything else through).
ARCH_X86_64, NR_UNSHARE = 0xC000003E, 272
code = [(0x20, 0, 0, 4), (0x15, 0, 3, ARCH_X86_64), (0x20, 0, 0, 0), (0x15, 0, 1, NR_UNSHARE),
        (0x06, 0, 0, 0x00050000 | 1), (0x06, 0, 0, 0x7FFF0000)]
blob = b"".join(struct.pack("HBBI", *c) for c in code)
buf = ctypes.create_string_buffer(blob)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
prog = Prog(len(code), ctypes.addressof(buf))
assert libc.prctl(38, 1, 0, 0, 0) == 0  # no_new_privs, so an unprivileged caller may filter
assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER

from astraflow import sandbox
out = {"namespaces": sandbox.namespaces_available()}
program = "def f(x):\n    return x + 1"
cases = [((1,), 2), ((2,), 3)]
refused = sandbox.check_function(program, "f", cases)
out["refused"] = [refused.passed, refused.reason, refused.detail]
out["run_refused"] = sandbox.run_python("print(1)").reason
opted_in = sandbox.SandboxSettings(allow_unisolated=True)
allowed = sandbox.check_function(program, "f", cases, settings=opted_in)
out["allowed"] = [allowed.passed, allowed.reason]
run = sandbox.run_python("import os\nprint(os.getuid())", settings=opted_in)
out["run"] = [run.reason, run.stdout, run.network_isolated]
# the path a component takes: its job config's sandbox section, bound once for the code reward
from astraflow.actors.common import configure_sandbox
from astraflow.config import JobConfig
from astraflow.typed_config import from_dict
from astraflow.workflows.code_tasks import run_cases
out["reward_refused"] = run_cases("x+1", cases)
configure_sandbox(from_dict(JobConfig, {"job": "j", "sandbox": {"allow_unisolated": True}}))
out["reward_allowed"] = run_cases("x+1", cases)
print(json.dumps(out))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the seccomp filter is written for x86_64")
def test_without_namespaces_code_does_not_run_unless_the_config_opts_in():
    proc = subprocess.run([sys.executable, "-c", SECCOMP_NO_UNSHARE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["namespaces"] is False
    passed, reason, detail = out["refused"]
    assert passed == [False, False] and reason == "no_isolation" and "sandbox.allow_unisolated" in detail
    assert out["run_refused"] == "no_isolation"
    assert out["allowed"] == [[True, True], "ok"]
    assert out["run"] == ["ok", f"{65534 if os.geteuid() == 0 else os.getuid()}\n", False]
    assert out["reward_refused"] == [[False, False], "no_isolation"]
    assert out["reward_allowed"] == [[True, True], "ok"]


def test_the_config_key_is_typed_and_off_by_default():
    base = {"job": "j"}
    assert from_dict(JobConfig, base).sandbox.allow_unisolated is False
    assert from_dict(JobConfig, {**base, "sandbox": {"allow_unisolated": True}}).sandbox.allow_unisolated is True
    with pytest.raises(ConfigError, match="sandbox.allow_unisolated"):
        from_dict(JobConfig, {**base, "sandbox": {"allow_unisolated": "yes"}})
    with pytest.raises(ConfigError, match="sandbox.allow_isolated"):
        from_dict(JobConfig, {**base, "sandbox": {"allow_isolated": True}})
    with pytest.raises(TypeError, match="allow_unisolated"):
        sandbox.SandboxSettings(allow_unisolated="yes")


@as_root
def test_opted_in_without_namespaces_a_root_caller_gives_the_program_nothing(victim):
    devices = ["/dev/kmsg", *block_devices()]
    result, got = attempts(f"""
    import signal
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    print(json.dumps(["ids", os.getuid(), os.getgid(), os.getgroups()]))
    print(json.dumps(["caps", [status[k].strip() for k in ("CapPrm", "CapEff", "CapBnd", "NoNewPrivs")]]))
    attempt("/etc/shadow", lambda: open("/etc/shadow").read())
    attempt("/root", lambda: os.listdir("/root"))
    for path in {devices!r}:  # os.open: the audit hook sees it, the kernel refuses it anyway
        attempt(path, lambda: os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK)))
    attempt("kill parent", lambda: os.kill(os.getppid(), signal.SIGKILL))
    attempt("kill host process", lambda: os.kill({victim.pid}, signal.SIGKILL))
    # around the audit hook (pidfd has no audit event): the kernel refuses uid 65534
    attempt("pidfd kill", lambda: signal.pidfd_send_signal(os.pidfd_open({victim.pid}), signal.SIGKILL))
    attempt("setuid 0", lambda: os.setuid(0))
    attempt("ctypes", lambda: __import__("ctypes").CDLL(None))
    attempt("sethostname", lambda: __import__("socket").sethostname(__import__("socket").gethostname()))
    """, namespaces=False)
    assert result.reason == "ok" and not result.network_isolated and victim.poll() is None
    assert got["ids"] == [65534, 65534, []]
    assert got["caps"] == [["0000000000000000"] * 3 + ["1"]]
    assert got["/etc/shadow"][0] == got["/root"][0] == "PermissionError"
    assert all(got[path][0] == "PermissionError" for path in devices)
    assert got["kill parent"][1].startswith("sandbox: os.kill of process")
    assert got["kill host process"][1].startswith("sandbox: os.kill of process")
    assert got["pidfd kill"] == got["setuid 0"] == ["PermissionError", "Operation not permitted"]
    assert got["ctypes"] == ["PermissionError", "sandbox: ctypes.dlopen is not allowed"]
    assert got["sethostname"] == ["PermissionError", "sandbox: socket.sethostname is not allowed"]


def test_a_result_cut_at_the_results_cap_fails_its_case_only():
    program = "def f(x):\n    return 'a' * (9 << 20) if x == 5 else x + 1"
    result = check_function(program, "f", CASES, limits=Limits(cpu_s=2, wall_s=20, memory_mb=256))
    assert result.passed == [True, True, False] and result.reason == "wrong_answer"
    assert "no result" in result.detail


# --- opted in without namespaces: host sockets and a direct mount --------------------------------

#: The real fallback: the seccomp filter above takes namespaces away, the config opts in, and
#: ``run_python`` (not ``_run``) decides how the program runs. Prints the result as JSON.
FALLBACK_RUN = SECCOMP_NO_UNSHARE.split("from astraflow import sandbox")[0] + r"""
from astraflow import sandbox
from astraflow.sandbox import Limits, SandboxSettings
assert not sandbox.namespaces_available()
run = sandbox.run_python(open(sys.argv[1]).read(), settings=SandboxSettings(allow_unisolated=True),
                         limits=Limits(cpu_s=2, wall_s=30, memory_mb=256, processes=16, file_mb=0.1, output_kb=16))
print(json.dumps({"reason": run.reason, "stdout": run.stdout, "network_isolated": run.network_isolated}))
"""

#: Around the audit hook: ``subprocess`` told its audit call is a no-op starts a fresh
#: interpreter through ``_posixsubprocess`` (which raises no audit event), and that one has no hook.
AROUND_THE_HOOK = r'''
import subprocess, types
fake = types.ModuleType("sys")
fake.__dict__.update(vars(sys))
fake.audit = lambda *a: None
subprocess.sys = fake
child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=20)
for line in child.stdout.splitlines():
    print(json.dumps(["around: " + json.loads(line)[0], *json.loads(line)[1:]]))
print(json.dumps(["child", child.returncode, child.stderr[-300:]]))
'''


def _unix_servers(directory: str) -> dict[str, socket.socket]:
    """A world-writable path socket, a private one (mode 0600, the test's uid), an abstract one
    and a TCP one: all the test's own, each reachable from the test itself."""
    servers = {}
    os.chmod(directory, 0o755)
    for name, address, family in (("public", os.path.join(directory, "public.sock"), socket.AF_UNIX),
                                  ("private", os.path.join(directory, "private.sock"), socket.AF_UNIX),
                                  ("abstract", "\0astraflow-test-" + os.path.basename(directory), socket.AF_UNIX),
                                  ("tcp", ("127.0.0.1", 0), socket.AF_INET)):
        server = socket.socket(family)
        server.bind(address)
        server.listen()
        server.settimeout(0.2)
        servers[name] = server
    os.chmod(servers["public"].getsockname(), 0o777)
    os.chmod(servers["private"].getsockname(), 0o600)
    for server in servers.values():  # the control: each one is live
        probe = socket.socket(server.family)
        probe.connect(server.getsockname())
        server.accept()[0].close()
        probe.close()
    return servers


def _fallback(program: str, directory: str) -> tuple[dict, dict[str, list]]:
    path = os.path.join(directory, "attack.py")
    with open(path, "w") as f:
        f.write(ATTEMPT + textwrap.dedent(program))
    proc = subprocess.run([sys.executable, "-c", FALLBACK_RUN, path], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    lines = [json.loads(line) for line in out["stdout"].splitlines() if line.startswith("[")]
    return out, {line[0]: line[1:] for line in lines}


def _mounts() -> str:
    with open("/proc/self/mountinfo") as f:
        return f.read()


_ATTACKS = """
import socket, subprocess
def connect(family, address):
    s = socket.socket(family)
    s.settimeout(1)
    s.connect(address)
for name, family, address in ADDRESSES:
    attempt(name, lambda: connect(family, address))
def mount():
    import ctypes  # (under the hook even the import is refused: it opens libc)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"tmpfs", os.getcwd().encode(), b"tmpfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
attempt("mount ctypes", mount)
attempt("mount program", lambda: subprocess.run(["mount", "-t", "tmpfs", "tmpfs", os.getcwd()]))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the seccomp filter is written for x86_64")
def test_opted_in_without_namespaces_host_sockets_and_a_mount_are_refused_with_their_reason():
    directory = tempfile.mkdtemp(prefix="astraflow-test-unisolated-")
    servers = _unix_servers(directory)
    before = _mounts()
    try:
        addresses = [(name, int(s.family), s.getsockname()) for name, s in servers.items()]
        out, got = _fallback(f"ADDRESSES = {addresses!r}\n" + _ATTACKS, directory)
        assert out["reason"] == "ok" and out["network_isolated"] is False, out
        for name in servers:  # the hook refuses every connect, whatever the socket's mode
            assert got[name] == ["PermissionError", "sandbox: socket.connect is not allowed"], (name, got[name])
        assert got["mount ctypes"] == ["PermissionError", "sandbox: ctypes.dlopen is not allowed"]
        assert got["mount program"] == ["PermissionError", "sandbox: subprocess.Popen is not allowed"]
        for server in servers.values():
            with pytest.raises(TimeoutError):
                server.accept()
        assert _mounts() == before
    finally:
        for server in servers.values():
            server.close()
        shutil.rmtree(directory)


@as_root
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the seccomp filter is written for x86_64")
def test_opted_in_without_namespaces_around_the_hook_the_kernel_refuses_the_mount_and_private_sockets():
    """The audit hook is a speed bump: a fresh interpreter gets past it. Then uid 65534 without
    capabilities is the wall: ``mount(2)`` fails with EPERM, a socket only its owner may write
    with EACCES. What it does not stop (docs/security.md): world-writable and abstract unix
    sockets and loopback TCP are reachable."""
    directory = tempfile.mkdtemp(prefix="astraflow-test-unisolated-")
    servers = _unix_servers(directory)
    before = _mounts()
    try:
        addresses = [(name, int(s.family), s.getsockname()) for name, s in servers.items()]
        child = (ATTEMPT + f"ADDRESSES = {addresses!r}\n" + textwrap.dedent(_ATTACKS).replace(
            'attempt("mount program"', '# attempt("mount program"')
                 + 'print(json.dumps(["uid", os.getuid()]))\n')
        out, got = _fallback(f"CHILD = {child!r}\n" + AROUND_THE_HOOK, directory)
        assert out["reason"] == "ok", out
        assert got["child"][0] == 0, got["child"]
        assert got["around: uid"] == [65534]
        assert got["around: mount ctypes"] == ["PermissionError", "Operation not permitted"]
        assert got["around: private"] == ["PermissionError", "Permission denied"]
        for name in ("public", "abstract", "tcp"):  # not stopped without namespaces (documented)
            assert got[f"around: {name}"] == ["ok"], (name, got[f"around: {name}"])
        assert _mounts() == before
    finally:
        for server in servers.values():
            server.close()
        shutil.rmtree(directory)
