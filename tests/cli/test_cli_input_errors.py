"""Every input error of the CLI is one line on stderr naming the input, never a traceback:
bad config values and files, bad flags, bad or unreachable bootstrap servers. Each case
runs ``python -m astraflow`` as a process, as a user would."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from astraflow.errors import EXIT_FATAL

ROOT = Path(__file__).resolve().parents[2]


def _astraflow(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astraflow", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _closed_port() -> int:
    """A port nothing listens on (bound for a moment by this process, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIG_CASES = {
    "groups_per_batch_0": ("job: x\ndataflow:\n  groups_per_batch: 0\n", "dataflow.groups_per_batch: must be in"),
    "lr_inf": ("job: x\ntrainer:\n  engine:\n    lr: .inf\n", "trainer.engine.lr: must be a finite number, got inf"),
    "temperature_nan": ("job: x\nrollout:\n  temperature: .nan\n", "rollout.temperature: must be a finite number"),
    "duplicate_key": ("job: x\ntrainer:\n  steps: 3\n  steps: 4\n", "trainer.steps: given twice (lines 3 and 4)"),
    "policy_dotdot": ("job: x\npolicy: ..\n", "policy: '..' is part of Kafka topic names and file paths"),
    "bootstrap_notaport": ("job: x\nkafka:\n  bootstrap_servers: 'host:notaport'\n", "has port 'notaport'"),
    "data_source_dir": ("job: x\ndata:\n  source: /etc\n", "dataset file /etc is not a file (data.source"),
    "not_yaml": ("job: [x\n", "<file>: not valid YAML at line 2, column 1"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_check_reports_a_bad_config_as_one_line_naming_file_and_key(tmp_path, case):
    text, words = CONFIG_CASES[case]
    path = tmp_path / "job.yaml"
    path.write_text(text)
    proc = _astraflow("config", "check", str(path))
    line = _one_line(proc)
    assert proc.returncode == EXIT_FATAL and line.startswith(f"astraflow: error: {path}: ") and words in line, line


def test_a_directory_as_the_config_file_is_one_line(tmp_path):
    for args in (("config", "check", str(tmp_path)), ("run", str(tmp_path)),
                 ("topology", "check", str(tmp_path)), ("chaos", str(tmp_path), "--check")):
        proc = _astraflow(*args)
        assert proc.returncode == EXIT_FATAL
        assert _one_line(proc) == f"astraflow: error: {tmp_path}: <file>: is a directory; give the YAML file"


def _bounded_memory() -> None:
    """A guard for the machine, not for the test: a loader that reads without end (today's
    /dev/zero) fails on this limit (a MemoryError traceback) instead of eating the host's memory."""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _alias_bomb(levels: int = 9, fan: int = 9) -> str:
    """Nine levels of nine-fold aliases: 31 lines that expand to 9**9 (387 million) strings."""
    rows = [f"    l0: &l0 [{', '.join(['lol'] * fan)}]"]
    rows += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]" for i in range(1, levels)]
    return "job: x\nworkflow:\n  params:\n" + "\n".join(rows) + "\n"


def test_a_yaml_alias_bomb_is_refused_in_one_line(tmp_path):
    """Aliases may repeat a block; they may not make the loader (or anything that walks the
    config after it) visit hundreds of millions of nodes. The timeout is the hang's guard."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    proc = subprocess.run([sys.executable, "-m", "astraflow", "config", "check", str(path)], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, preexec_fn=_bounded_memory)
    line = _one_line(proc)
    assert proc.returncode == EXIT_FATAL, proc.stderr
    assert line.startswith(f"astraflow: error: {path}: <file>: YAML aliases expand to more than "), line
    # a few aliases that repeat a block stay fine (an anchor reused, a merge key)
    path.write_text("job: x\nworkflow:\n  params:\n    base: &b {max_turns: 2}\n    more: {<<: *b}\n"
                    "    again: *b\n")
    from astraflow.typed_config import load_yaml
    assert load_yaml(path)["workflow"]["params"]["again"] == {"max_turns": 2}


def test_a_recursive_alias_is_refused_in_one_line(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("job: x\nworkflow:\n  params:\n    loop: &l [1, *l]\n")
    proc = _astraflow("config", "check", str(path), timeout=60)
    assert proc.returncode == EXIT_FATAL
    assert _one_line(proc).startswith(f"astraflow: error: {path}: <file>: an alias inside its own anchor")


def test_a_config_file_that_is_not_a_regular_file_of_bounded_size_is_refused_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "astraflow", "config", "check", "/dev/zero"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, preexec_fn=_bounded_memory)
    assert proc.returncode == EXIT_FATAL
    assert _one_line(proc) == "astraflow: error: /dev/zero: <file>: is a character device, not a regular file; " \
                              "give the YAML file"
    from astraflow.typed_config import MAX_YAML_BYTES
    big = tmp_path / "big.yaml"
    big.write_text("job: x\n" + "#" * MAX_YAML_BYTES + "\n")
    proc = _astraflow("config", "check", str(big), timeout=60)
    assert proc.returncode == EXIT_FATAL
    assert _one_line(proc) == (f"astraflow: error: {big}: <file>: is {big.stat().st_size} bytes; a config file "
                               f"is at most {MAX_YAML_BYTES} bytes")
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    proc = _astraflow("config", "check", str(fifo), timeout=60)
    assert proc.returncode == EXIT_FATAL
    assert _one_line(proc) == f"astraflow: error: {fifo}: <file>: is a named pipe, not a regular file; " \
                              "give the YAML file"


def test_a_bad_override_is_one_line_naming_it():
    example = str(ROOT / "examples" / "arithmetic_grpo.yaml")
    for pair, words in (("trainer.steps=[", "--set trainer.steps=[: the value is not YAML"),
                        ("trainer.steps", "--set expects KEY=VALUE, got 'trainer.steps'"),
                        ("trainer.steps=1e38", "trainer.steps: expected int, got float 1e+38"),
                        ("trainer.engine.lr=.inf", "trainer.engine.lr: must be a finite number")):
        proc = _astraflow("config", "check", example, "--set", pair)
        line = _one_line(proc)
        assert proc.returncode == EXIT_FATAL and words in line, line


def test_bad_flags_are_one_line_naming_the_flag():
    for args, words in ((("status", "--bootstrap-servers", "x:1", "--job", ".."),
                         "astraflow status: error: argument --job: '..' is part of Kafka topic names"),
                        (("broker", "start", "--port", "x"), "argument --port: invalid int value: 'x'"),
                        (("status", "--job", "j"), "one of the arguments --bootstrap-servers --run-dir is required")):
        proc = _astraflow(*args)
        line = _one_line(proc)
        assert proc.returncode == 2 and words in line and line.endswith("--help)"), line


def test_a_bootstrap_that_is_not_host_port_is_one_line_naming_the_flag():
    proc = _astraflow("status", "--bootstrap-servers", "host:notaport", "--job", "j")
    assert proc.returncode == EXIT_FATAL
    assert _one_line(proc) == ("astraflow: error: --bootstrap-servers: 'host:notaport' has port 'notaport'; a port is "
                               "a number 1-65535 (in 'host:notaport')")


def test_an_unreachable_bootstrap_is_one_line_within_its_bound(tmp_path):
    """The probe's bound (10 s) passes well before the Kafka client's own 30 s timeout would; the
    subprocess timeout is only a guard against a hang."""
    port = _closed_port()
    proc = _astraflow("status", "--bootstrap-servers", f"127.0.0.1:{port}", "--job", "j", timeout=60)
    line = _one_line(proc)
    assert proc.returncode == 1  # retriable: the broker may yet start
    assert line.startswith(f"astraflow: error: --bootstrap-servers 127.0.0.1:{port}: no broker accepted a "
                           "connection within 10 s") and "Connection refused" in line, line
    # from the config file: named as such
    path = tmp_path / "job.yaml"
    path.write_text(f"job: x\nkafka:\n  bootstrap_servers: '127.0.0.1:{port}'\n")
    proc = _astraflow("run", str(path), timeout=60)
    line = _one_line(proc)
    assert line.startswith(f"astraflow: error: kafka.bootstrap_servers of {path} 127.0.0.1:{port}: no broker"), line


def test_a_reachable_bootstrap_is_not_refused(bootstrap):
    proc = _astraflow("status", "--bootstrap-servers", bootstrap, "--job", "nobody-ran-this", "--json")
    assert proc.returncode == 1 and not proc.stderr, proc.stderr  # reached; the job is unknown there (says so)
    assert '"job": "nobody-ran-this"' in proc.stdout and '"state": "unknown"' in proc.stdout


def test_a_commands_own_usage_errors_exit_2_like_argparses(tmp_path, capsys):
    """Flags a command checks itself (missing together, out of range, naming nothing known) are
    the same usage error as argparse's: exit 2, one line naming the flag, the --help hint."""
    from astraflow.cli import main
    for args, words in ((["acl", "plan"], "astraflow acl: error: give --config (or --job and --policy)"),
                        (["acl", "plan", "--job", "j", "--principal", "nobody=x"], "--principal 'nobody=x': expected"),
                        (["runs", "prune", "--root", str(tmp_path), "--older-than", "3x"], "--older-than '3x'"),
                        (["runs", "prune", "--root", str(tmp_path), "--keep", "-1"], "--keep -1: must be >= 0"),
                        (["broker", "start", "--nodes", "0", "--state-dir", str(tmp_path)], "--nodes must be >= 1"),
                        (["broker", "start", "--secure", "--nodes", "3", "--state-dir", str(tmp_path)],
                         "--secure starts a lone node"),
                        (["config", "check"], "astraflow config: error: check: give the config file"),
                        (["track"], "astraflow track: error: give --job (or --config")):
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0] and err[0].endswith("--help)"), err
    assert not (tmp_path / "data").exists()  # nothing started
