"""The trainer's group agent (astraflow/trainer_group.py) around tiny rank commands.

Real torch elastic agents start real rank processes here; the ranks are small Python
programs instead of trainers, so what is tested is the agent: flags, what it does when a
rank finishes, dies or fails fatally, and that ranks die with their agent. The trainer
ranks themselves run in tests/e2e/test_trainer_ranks.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from astraflow.cli.args import EXIT_USAGE
from astraflow.errors import EXIT_FATAL
from astraflow.trainer_group import FlagError, Topology, group_failure

# The agent runs in its own process: torch's launcher takes over its signals and streams.
AGENT = """
import json, sys
from astraflow.trainer_group import Topology, run_agent
a = json.loads(sys.argv[1])
sys.exit(run_agent(Topology(**a["topo"]), a["cmd"], node_id="grp", log_dir=a["log_dir"], run_id="t"))
"""


def _agent(tmp_path: Path, rank_code: str, ranks: int = 2) -> subprocess.Popen:
    spec = {"topo": {"ranks": ranks}, "cmd": [sys.executable, "-c", rank_code], "log_dir": str(tmp_path / "ranks")}
    log = open(tmp_path / "agent.log", "wb")
    p = subprocess.Popen([sys.executable, "-c", AGENT, json.dumps(spec)], stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    return p


def _wait(p: subprocess.Popen, timeout: float = 120) -> int:
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise


def _lines(tmp_path: Path) -> list[str]:
    return [ln for ln in (tmp_path / "agent.log").read_text().splitlines() if ln.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: its parent (the agent) has not reaped it yet.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _pids(tmp_path: Path, n: int, timeout: float = 60) -> dict[int, int]:
    """{rank: pid} from the ranks' ``pid R P`` lines in the agent's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for ln in _lines(tmp_path):
            words = ln.split("pid ")[-1].split() if "pid " in ln and ln.startswith("[rank") else []
            if len(words) == 2 and words[0].isdigit() and words[1].isdigit():
                found[int(words[0])] = int(words[1])
        if len(found) == n:
            return found
        time.sleep(0.1)
    raise TimeoutError(f"ranks did not report their pids: {_lines(tmp_path)}")


SAY_PID = "import os, sys, time; r = int(os.environ['RANK']); print('pid', r, os.getpid(), flush=True)\n"


def test_topology_flags():
    t = Topology(2, nnodes=3, node_rank=1, master_addr="10.0.0.1", master_port=29500)
    assert (t.world_size, list(t.global_ranks)) == (6, [2, 3])
    assert Topology(1).world_size == 1
    for kw, words in [({"nnodes": 0}, "--nnodes must be >= 1, got 0"),
                      ({"nnodes": 2, "node_rank": 2, "master_port": 1}, "--node-rank must be between 0 and"),
                      ({"node_rank": -1}, "--node-rank"),
                      ({"nnodes": 2, "node_rank": 1}, "--master-port is required with --nnodes 2"),
                      ({"master_port": 70000}, "--master-port must be a TCP port"),
                      ({"master_addr": " "}, "--master-addr is empty")]:
        with pytest.raises(FlagError, match=words):
            Topology(1, **kw)


def test_node_flags_are_checked_before_anything_starts(tmp_path, capsys):
    from astraflow.cli import main
    cfg = tmp_path / "job.yaml"
    cfg.write_text("job: flags\n")
    base = ["node", "--config", str(cfg), "--bootstrap-servers", "127.0.0.1:1", "--run-dir", str(tmp_path / "r")]
    assert main(base + ["--role", "trainer", "--nnodes", "2", "--node-rank", "1"]) == EXIT_USAGE
    assert "--master-port is required with --nnodes 2" in capsys.readouterr().err.splitlines()[-1]
    assert main(base + ["--role", "raas", "--nnodes", "2", "--master-port", "29500"]) == EXIT_USAGE
    assert "--nnodes, --master-port place trainer ranks; --role raas takes none" in capsys.readouterr().err
    assert main(base + ["--role", "trainer", "--set", "trainer.ranks=0"]) == EXIT_FATAL
    assert "trainer.ranks: must be in [1, 4096], got 0" in capsys.readouterr().err  # (named with its file)


def test_ranks_finish_and_their_output_is_prefixed_with_their_rank(tmp_path):
    p = _agent(tmp_path, SAY_PID + "print('world', os.environ['WORLD_SIZE'], 'local', os.environ['LOCAL_RANK'])")
    assert _wait(p) == 0
    lines = _lines(tmp_path)
    assert "[rank0]: world 2 local 0" in lines and "[rank1]: world 2 local 1" in lines, lines
    # Each rank's output is also kept whole in its own file.
    assert len(list((tmp_path / "ranks").glob("*/*/attempt_0/*/stdout.log"))) == 2


def test_a_killed_rank_stops_the_group_and_the_agent_exits_nonzero(tmp_path):
    code = SAY_PID + "time.sleep(1) if r == 1 else None\nif r == 1: os.kill(os.getpid(), 9)\ntime.sleep(600)"
    p = _agent(tmp_path, code)
    pids = _pids(tmp_path, 2)
    assert _wait(p) == 1  # not a hang: rank 0 would sleep for ten minutes
    last = _lines(tmp_path)[-1]
    assert last == (f"astraflow node grp: error: trainer rank 1 (pid {pids[1]}) was killed by SIGKILL; "
                    f"the group's other ranks were stopped"), _lines(tmp_path)
    assert not _alive(pids[0])


def test_a_fatal_rank_makes_the_agent_exit_fatal_with_its_cause_last(tmp_path):
    code = (SAY_PID + "if r == 1:\n    time.sleep(1)\n"
            "    print('astraflow node grp.rank1: fatal: trainer.engine.thing: bad value', file=sys.stderr)\n"
            "    sys.exit(3)\ntime.sleep(600)")
    p = _agent(tmp_path, code)
    assert _wait(p) == EXIT_FATAL
    lines = _lines(tmp_path)
    assert "[rank1]: astraflow node grp.rank1: fatal: trainer.engine.thing: bad value" in lines
    assert lines[-1] == "astraflow node grp: fatal: trainer.engine.thing: bad value", lines


def test_a_rank_that_does_not_stop_dies_of_the_signal_after_a_grace(tmp_path):
    # Rank 0 stands for a trainer blocked in a collective with a dead peer: its handler only
    # asks it to stop. Without the grace torch would wait 30 s, then SIGKILL it.
    code = ("import signal\n" + SAY_PID + "from astraflow.trainer_group import die_unless_stopped\n"
            "signal.signal(signal.SIGTERM, lambda s, f: die_unless_stopped(s))\n"
            "if r == 1:\n    time.sleep(2)\n    print('astraflow: error: boom', file=sys.stderr)\n    sys.exit(1)\n"
            "time.sleep(600)")
    p = _agent(tmp_path, code)
    assert _wait(p) == 1
    lines = _lines(tmp_path)
    assert not [ln for ln in lines if "forcefully exiting via 9" in ln], lines
    assert lines[-1].startswith("astraflow node grp: error: trainer rank 1 (pid ") and lines[-1].endswith(
        ") exited with code 1: boom; the group's other ranks were stopped"), lines


def test_ranks_die_with_their_agent(tmp_path):
    code = SAY_PID + ("from astraflow.trainer_group import start_rank\n"
                      "start_rank(f'grp.rank{r}', r)\ntime.sleep(600)")
    p = _agent(tmp_path, code)
    pids = _pids(tmp_path, 2)
    os.kill(p.pid, signal.SIGKILL)  # the agent cannot stop its ranks: they must notice
    p.wait()
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [pid for pid in pids.values() if _alive(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive


def test_a_fatal_rank_decides_even_when_a_peer_failed_first(tmp_path):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    attempt = tmp_path / "t_x" / "attempt_0"
    for rank, last in [(0, "astraflow node g.rank0: error: trainer failed: Connection closed by peer"),
                       (1, "astraflow node g.rank1: fatal: checkpoint world 1 != 2")]:
        (attempt / str(rank)).mkdir(parents=True)
        (attempt / str(rank) / "stderr.log").write_text(f"some log\n{last}\n")
    # Only rank 0 had exited when the agent looked; rank 1 was stopped with the group.
    failures = {0: ProcessFailure(local_rank=0, pid=11, exitcode=1, error_file=str(attempt / "0" / "error.json"))}
    assert group_failure(failures, tmp_path) == (True, "checkpoint world 1 != 2")
    (attempt / "1" / "stderr.log").write_text("still training\n")
    assert group_failure(failures, tmp_path) == (False, "trainer rank 0 (pid 11) exited with code 1: trainer failed: "
                                              "Connection closed by peer; the group's other ranks were stopped")
