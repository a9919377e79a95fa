"""The trainer as a group of ranks, with real processes: ranks on two "hosts" (two group
agents meeting at a rendezvous port), two ranks on one host, a rank SIGKILLed mid-run in
both, and a rank's fatal failure stopping ``astraflow run``.

A rank's pid comes from its ``trainer.rank_ready`` metric; what each group trained comes
from the checkpoint lineage and the conservation audit.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from astraflow.chaos.harness import JobHarness
from astraflow.engines.checkpoints import CheckpointStore
from astraflow.errors import EXIT_FATAL
from astraflow.topics import ensure_topics, job_topics
from astraflow.topology.processes import Proc, node_command
from astraflow.trainer_group import TEST_RANK_FATAL_ENV, free_port

from .test_chaos import _assert_conserved
from .test_fail_fast import _astraflow, _last_line
from .test_trainer_crash import _assert_trained_once_in_order

# A rank whose peer died fails its next collective at once (the socket closes); the
# timeout only bounds a peer that vanished without closing it.
GROUP = {"trainer": {"steps": 4, "checkpoint_every": 1, "engine": {"threads": 1, "collective_timeout_s": 120}}}


def _start(cfg, bootstrap, tmp_path) -> JobHarness:
    ensure_topics(bootstrap, job_topics(cfg).specs())
    h = JobHarness(cfg, bootstrap, tmp_path / "run")
    h.start("dataflow", "dataflow")
    h.start("raas", "raas-0")
    return h


def _start_agent(h: JobHarness, node_id: str, flags: list[str]) -> float:
    """Start a trainer agent with extra ``astraflow node`` flags; returns the start time."""
    cmd = node_command("trainer", h.cfg, h.bootstrap, h.run_dir, node_id, h.overrides) + flags
    proc = Proc("trainer", node_id, cmd, h.run_dir / "logs" / f"{node_id}.log")
    started = time.time()
    proc.start()
    h.procs[node_id] = proc
    return started


def _host_flags(k: int, port: int) -> list[str]:
    return ["--nnodes", "2", "--node-rank", str(k), "--master-addr", "127.0.0.1", "--master-port", str(port)]


def _rank_pids(h: JobHarness, since: float, world: int) -> dict[int, int]:
    pids = {}
    for r in range(world):
        m = h.wait_for(lambda m: m.name == "trainer.rank_ready" and int(m.value) == r and m.ts >= since,
                       300, f"trainer.rank_ready of rank {r}")
        assert int(m.labels["world_size"]) == world
        pids[r] = int(m.labels["pid"])
    return pids


def _rank0(name: str, since: float = 0.0):
    return lambda m: m.name == name and int(m.labels.get("rank", 0)) == 0 and m.ts >= since


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, OSError):
        return False


@pytest.mark.slow
def test_two_hosts_train_as_one_group_and_a_dead_rank_on_one_stops_both(make_job_config, bootstrap, tmp_path):
    cfg = make_job_config(GROUP, name="ranks-hosts")
    h = _start(cfg, bootstrap, tmp_path)
    store = CheckpointStore(tmp_path / "run" / "checkpoints" / cfg.policy)
    agents = ["trainer-0", "trainer-1"]
    try:
        port = free_port()
        since = min(_start_agent(h, a, _host_flags(k, port)) for k, a in enumerate(agents))
        pids = _rank_pids(h, since, world=2)
        h.wait_for(lambda m: _rank0("trainer.samples")(m) and m.step >= 2, 600, "trainer step 2")
        os.kill(pids[1], signal.SIGKILL)  # host 1's only rank
        # Host 1's agent sees its rank die; host 0's rank fails its next collective and, unable
        # to re-enter the group, ends its process, so host 0's agent exits too.
        codes = {a: h.wait_exit(a, 300) for a in agents}
        assert all(c not in (0, EXIT_FATAL) for c in codes.values()), codes
        assert h.procs["trainer-1"].last_line().startswith(
            f"astraflow node trainer-1: error: trainer rank 1 (pid {pids[1]}) was killed by SIGKILL")
        host0 = (h.run_dir / "logs" / "trainer-0.log").read_text()
        assert "supervisor: restarting trainer" not in host0
        assert "[rank0]: " in host0 and "trainer-0.rank0" in host0
        published = store.latest().step

        port = free_port()  # the old one may linger in TIME_WAIT
        since = min(_start_agent(h, a, _host_flags(k, port)) for k, a in enumerate(agents))
        resumed = h.wait_for(_rank0("trainer.resumed_step", since), 300, "trainer.resumed_step")
        assert resumed.value == published >= 1
        h.wait_for(_rank0("trainer.done", since), 600, "trainer.done")
        assert {a: h.wait_exit(a, 120) for a in agents} == {a: 0 for a in agents}
        report = h.audit_until_settled()
    finally:
        h.stop_all()
    _assert_conserved(report, cfg)
    _assert_trained_once_in_order(store, cfg.trainer.steps)


@pytest.mark.slow
def test_sigkilled_rank_stops_its_group_and_the_restarted_group_resumes(make_job_config, bootstrap, tmp_path):
    # ZeRO-3: parameters partitioned over the ranks; rank 0 publishes them gathered.
    cfg = make_job_config({**GROUP, "trainer": {**GROUP["trainer"], "ranks": 2,
                                                "engine": {**GROUP["trainer"]["engine"], "zero_stage": 3}}},
                          name="ranks-kill")
    h = _start(cfg, bootstrap, tmp_path)
    store = CheckpointStore(tmp_path / "run" / "checkpoints" / cfg.policy)
    try:
        since = time.time()
        h.start("trainer", "trainer")
        pids = _rank_pids(h, since, world=2)
        h.wait_for(lambda m: _rank0("trainer.samples")(m) and m.step >= 2, 600, "trainer step 2")
        os.kill(pids[1], signal.SIGKILL)
        code = h.wait_exit("trainer", 300)  # bounded: the agent stops rank 0 and gives up
        assert code not in (0, EXIT_FATAL), code
        assert h.procs["trainer"].last_line() == (f"astraflow node trainer: error: trainer rank 1 (pid {pids[1]}) "
                                                  f"was killed by SIGKILL; the group's other ranks were stopped")
        assert not _alive(pids[0])
        published = store.latest().step

        since = time.time()
        h.start("trainer", "trainer")
        resumed = h.wait_for(_rank0("trainer.resumed_step", since), 300, "trainer.resumed_step")
        assert resumed.value == published >= 1
        done = h.wait_for(_rank0("trainer.done", since), 600, "trainer.done")
        assert h.wait_exit("trainer", 120) == 0
        report = h.audit_until_settled()
    finally:
        h.stop_all()
    _assert_conserved(report, cfg)
    _assert_trained_once_in_order(store, cfg.trainer.steps)
    # What rank 0 published last is, bit for bit, DeepSpeed's own consolidation of the
    # final checkpoint's ZeRO-3 shards.
    assert done.labels["weights_digest"] == _consolidated_digest(store.latest().path)
    log = (tmp_path / "run" / "logs" / "trainer.log").read_text()
    assert "[rank1]: " in log and "trainer.rank1" in log  # rank output is in the agent's log, attributable


def test_fatal_rank_stops_the_run_with_its_cause_as_the_last_line(make_job_config, bootstrap, tmp_path):
    from astraflow.models.bootstrap import ensure_tiny_model
    ensure_tiny_model()
    cfg = make_job_config({**GROUP, "trainer": {**GROUP["trainer"], "ranks": 2}}, name="ranks-fatal")
    run_dir = tmp_path / "run"
    env = {**os.environ, TEST_RANK_FATAL_ENV: "1:trainer.engine.thing: rank 1 rejects it"}
    r = _astraflow("run", cfg.source, "--bootstrap-servers", bootstrap, "--quiet", "--run-dir", str(run_dir),
                   timeout=300, env=env)
    assert r.returncode == EXIT_FATAL, r.stdout
    assert _last_line(r.stdout) == "astraflow: error: trainer: trainer.engine.thing: rank 1 rejects it", r.stdout
    lines = [ln for ln in (run_dir / "logs" / "trainer.log").read_text().splitlines() if ln.strip()]
    # The rank said it first; the agent's last line carries it to the launcher, which did not restart it.
    assert any(ln.startswith("[rank1]: ") and "rank 1 rejects it" in ln for ln in lines), lines
    assert lines[-1] == "astraflow node trainer: fatal: trainer.engine.thing: rank 1 rejects it"
    assert "restarting" not in r.stdout


def _consolidated_digest(step_dir: Path) -> str:
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoModelForCausalLM

    from astraflow.engines.deepspeed_checkpoint import CKPT_TAG
    from astraflow.models.bootstrap import ensure_tiny_model
    from astraflow.weights.codec import weights_digest

    full = get_fp32_state_dict_from_zero_checkpoint(str(step_dir), tag=CKPT_TAG)
    model = AutoModelForCausalLM.from_pretrained(str(ensure_tiny_model()), dtype=torch.float32)
    model.load_state_dict(full, strict=False)  # tied weights: the consolidation names each parameter once
    return weights_digest({k: v.detach().float() for k, v in model.state_dict().items()})
