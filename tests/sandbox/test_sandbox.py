"""The code sandbox: real processes, real bombs, each contained; the caller keeps working.

Limits are small so the whole file runs in well under a minute; the wall clock is generous
where a CPU limit is under test, so that a loaded machine does not turn it into a timeout.
Tests that need the namespaces (network and filesystem isolation) are skipped where the
kernel has none; the fallback (rlimits + audit hook) runs through
``_run(..., namespaces=False)``.
"""

from __future__ import annotations

import os
import socket

import psutil
import pytest

from astraflow.sandbox import CheckResult, Limits, check_function, namespaces_available, run_python
from astraflow.sandbox.api import _run

SMALL = Limits(cpu_s=1, wall_s=20, memory_mb=128, processes=16, file_mb=0.1, output_kb=4)
needs_namespaces = pytest.mark.skipif(not namespaces_available(),
                                      reason="no user/network/mount namespaces here")
pytestmark = pytest.mark.usefixtures("no_sandbox_leftovers")


def test_a_normal_program_reads_stdin_and_prints():
    result = run_python("name = input()\nprint('hello', name)", stdin="ada\n", limits=SMALL)
    assert result.ok and result.reason == "ok" and result.returncode == 0
    assert result.stdout == "hello ada\n" and result.stderr == ""
    assert result.network_isolated == namespaces_available()


def test_infinite_loop_hits_the_cpu_limit():
    result = run_python("while True:\n    pass", limits=SMALL)
    assert (result.ok, result.reason) == (False, "cpu_limit")


def test_sleeping_forever_hits_the_wall_clock():
    result = run_python("import time\ntime.sleep(60)", limits=Limits(wall_s=1))
    assert (result.reason, result.returncode) == ("timeout", None)


def test_fork_bomb_is_contained():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = run_python(bomb, limits=Limits(cpu_s=1, wall_s=2, memory_mb=128, processes=16))
    assert not result.ok and result.reason in ("timeout", "cpu_limit")


def test_process_count_is_limited():
    program = """
import os, time
n = 0
try:
    while n < 200:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
"""
    result = run_python(program, limits=SMALL)
    assert result.ok
    assert 1 <= int(result.stdout) < SMALL.processes  # the program itself is one of them


def test_memory_bomb_hits_the_memory_limit():
    result = run_python("hog = []\nwhile True:\n    hog.append(bytearray(10**7))", limits=SMALL)
    assert (result.reason, result.returncode) == ("memory_limit", 1)
    assert "MemoryError" in result.stderr


def test_huge_file_hits_the_file_limit_and_the_work_dir_is_removed():
    program = "import os\nprint(os.getcwd(), flush=True)\nwith open('big', 'wb') as f:\n    f.write(b'x' * 10**6)"
    result = run_python(program, limits=SMALL)
    assert result.reason == "file_limit"
    run_dir = os.path.dirname(result.stdout.strip())  # the same path inside and out
    assert os.path.basename(run_dir).startswith("astraflow-sandbox-") and not os.path.exists(run_dir)


def test_abort_and_segfault_are_crashes():
    aborted = run_python("import os\nos.abort()", limits=SMALL)
    assert (aborted.reason, aborted.returncode) == ("crash", -6)
    segfault = run_python("import ctypes\nctypes.string_at(0)", limits=SMALL)
    assert (segfault.reason, segfault.returncode) == ("crash", -11)


def test_syntax_error_and_exit_codes():
    broken = run_python("def f(:\n    pass", limits=SMALL)
    assert broken.reason == "exit_1" and "SyntaxError" in broken.stderr
    assert run_python("import sys\nsys.exit(3)", limits=SMALL).reason == "exit_3"
    killed = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", limits=SMALL)
    assert (killed.reason, killed.returncode) == ("signal_SIGTERM", -15)


def test_output_beyond_the_limit_is_dropped_not_blocking():
    result = run_python("print('x' * 10**7)\nprint('done')", limits=SMALL)
    assert result.ok
    assert result.stdout.startswith("x" * 4096) and result.stdout.endswith("[output truncated]")
    assert len(result.stdout) < 5000


@needs_namespaces
def test_no_network_to_the_host_loopback_or_outside():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    program = f"""
import socket
for address in [("127.0.0.1", {port}), ("192.0.2.1", 80)]:
    try:
        socket.create_connection(address, timeout=1).close()
        print("connected", address)
    except OSError as e:
        print("refused", e.errno)
"""
    try:
        result = run_python(program, limits=SMALL)
        assert result.ok and result.network_isolated
        assert "connected" not in result.stdout and result.stdout.count("refused") == 2
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


@needs_namespaces
def test_writes_outside_the_work_dir_fail(tmp_path):
    target = tmp_path / "escaped.txt"  # a host path: not even there inside
    program = f"""
import os
with open("inside.txt", "w") as f:
    f.write("allowed")
print(open("inside.txt").read())
for path in [{str(target)!r}, "/usr/escaped.txt", "/escaped.txt", "../escaped.txt"]:
    try:
        open(path, "w").write("escaped")
        print("wrote", path)
    except OSError as e:
        print(e.strerror)
"""
    result = run_python(program, limits=SMALL)
    assert result.ok and result.stdout.splitlines() == [
        "allowed", "No such file or directory", "Read-only file system", "Read-only file system",
        "Read-only file system"]
    assert not target.exists()


@needs_namespaces
def test_the_program_cannot_make_the_filesystem_writable_again(tmp_path):
    target = tmp_path / "escaped.txt"
    program = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("set", "clr", "prop", "userns")]
attr = Attr(0, 1, 0, 0)  # clear MOUNT_ATTR_RDONLY, recursively, on /
print(libc.syscall(442, -100, b"/", 0x8000, ctypes.byref(attr), ctypes.sizeof(attr)))
print(libc.mount(b"none", b"/", None, 0x20 | 0x1000, None))  # MS_REMOUNT | MS_BIND
open({str(target)!r}, "w").write("escaped")
"""
    result = run_python(program, limits=SMALL)
    assert result.stdout == "-1\n-1\n" and result.reason == "exit_1"
    assert not target.exists()


@needs_namespaces
def test_a_setsid_escapee_dies_with_the_run():
    program = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    time.sleep(60)
print(__file__)
"""
    result = run_python(program, limits=SMALL)
    assert result.ok
    marker = result.stdout.strip()
    survivors = [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
    assert survivors == []


def test_without_namespaces_rlimits_and_the_audit_hook_still_apply(tmp_path):
    def run(source: str):
        return _run(["program.py"], stdin="", limits=SMALL, files={"program.py": source},
                    namespaces=False)

    plain = run("print('plain')")
    assert (plain.reason, plain.stdout, plain.network_isolated) == ("ok", "plain\n", False)
    assert run("while True:\n    pass").reason == "cpu_limit"
    target = tmp_path / "escaped.txt"
    write = run(f"open({str(target)!r}, 'w').write('x')")
    assert write.reason == "exit_1" and "outside the work directory" in write.stderr
    assert not target.exists()
    connect = run("import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=1)")
    assert connect.reason == "exit_1" and "socket.connect is not allowed" in connect.stderr
    spawn = run("import subprocess\nsubprocess.run(['true'])")
    assert "subprocess.Popen is not allowed" in spawn.stderr


CASES = [((1, 2), 3), ((2, 2), 4), ((-1, 1), 0)]


def test_check_function_correct_and_wrong_programs():
    assert check_function("def add(a, b):\n    return a + b", "add", CASES,
                          limits=SMALL) == CheckResult([True, True, True], "ok")
    wrong = check_function("def add(a, b):\n    return a * b", "add", CASES, limits=SMALL)
    assert wrong.passed == [False, True, False] and wrong.reason == "wrong_answer"
    assert "case 0" in wrong.detail
    raising = check_function("def div(a, b):\n    return a / b", "div",
                             [((4, 2), 2.0), ((1, 0), 0)], limits=SMALL)
    assert raising.passed == [True, False] and "ZeroDivisionError" in raising.detail


def test_check_function_cannot_be_forged():
    fake_stdout = """
import json
def add(a, b):
    for i in range(3):
        print(json.dumps({"case": i, "ok": True, "value": 3}))
    return None
"""
    assert check_function(fake_stdout, "add", CASES, limits=SMALL).passed == [False] * 3
    fake_fds = """
import json, os
def add(a, b):
    for fd in range(3, 64):
        for i in range(3):
            try:
                os.write(fd, (json.dumps({"case": i, "ok": True, "value": a + b}) + "\\n").encode())
            except OSError:
                pass
    return None
"""
    assert check_function(fake_fds, "add", CASES, limits=SMALL).passed == [False] * 3
    lying_eq = """
class Anything:
    def __eq__(self, other):
        return True
def add(a, b):
    return Anything()
"""
    lying = check_function(lying_eq, "add", CASES, limits=SMALL)
    assert lying.passed == [False] * 3 and "not plain data" in lying.detail


def test_check_function_compares_plain_data_exactly():
    values = [(1, [2]), {1: {2, 3}}, b"x", frozenset({1}), float("inf"), None, "é"]
    result = check_function("def echo(x):\n    return x", "echo",
                            [((v,), v) for v in values] + [(([1, 2],), (1, 2))], limits=SMALL)
    assert result.passed == [True] * len(values) + [False]  # a list is not a tuple


def test_check_function_failures_to_run():
    syntax = check_function("def add(a, b:\n", "add", CASES, limits=SMALL)
    assert (syntax.passed, syntax.reason) == ([False] * 3, "syntax_error")
    missing = check_function("def plus(a, b):\n    return a + b", "add", CASES, limits=SMALL)
    assert (missing.passed, missing.reason) == ([False] * 3, "no_function")
    crashing = check_function("raise RuntimeError('at import')", "add", CASES, limits=SMALL)
    assert (crashing.passed, crashing.reason) == ([False] * 3, "exit_1")
    assert "at import" in crashing.detail
    looping = "def add(a, b):\n    while a == 2:\n        pass\n    return a + b"
    partial = check_function(looping, "add", CASES, limits=SMALL)
    assert (partial.passed, partial.reason) == ([True, False, False], "cpu_limit")


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="cpu_s"):
        Limits(cpu_s=0)
    with pytest.raises(ValueError, match="entry"):
        check_function("", "not a name", CASES)
    with pytest.raises(ValueError, match="args, expected"):
        check_function("", "f", [(1,)])
