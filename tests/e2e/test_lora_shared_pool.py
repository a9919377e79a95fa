"""Two LoRA policies of one base on ONE RaaS pool, end to end (examples/solver_verifier_lora_shared.yaml):
real processes; the solver's node holds the base once and both adapters, plays both roles, and
every group carries its own policy's versions; each policy trains its own adapter and the
audit holds per policy and per episode."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from astraflow.launcher import run_job

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("example", ["solver_verifier_lora_shared", "code_solver_testgen_lora_shared"])
def test_two_lora_policies_share_one_pool_with_their_own_versions_and_audit_ok(bootstrap, tmp_path, example):
    """The solver-verifier team and the code team (solver and test generator: attempts and test
    cases from one engine, the cases run in the sandbox), each on one pool."""
    from astraflow.config import load_config
    from astraflow.topics import Batch, TrajectoryGroup, VersionAnnouncement, job_topics
    from astraflow.topics.replay import read_topic

    data = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    data.update({"job": f"lora-shared-{uuid.uuid4().hex[:8]}", "run_dir": str(tmp_path / "runs")})
    data["rollout"].update({"tasks_per_call": 4, "heartbeat_s": 1.0})
    data["dataflow"] = {"groups_per_batch": 4, "max_staleness": 1}
    data["trainer"].update({"steps": 4, "checkpoint_every": 2, "snapshot_every": 2})
    data["eval"] = {"every": 0, "problems": 20, "k": 1, "threads": 1}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)

    summary = run_job(cfg, bootstrap=bootstrap, progress=False, timeout_s=700)
    assert summary["error"] is None, summary["error"]
    assert summary["audit"]["ok"] is True, summary["audit"]

    topics = job_topics(cfg)
    anns = [m for _, _, m in read_topic(bootstrap, topics.versions) if isinstance(m, VersionAnnouncement)]
    bases = {a.policy: a.base_model for a in anns}
    assert set(bases) == set(cfg.policy_names) and len(set(bases.values())) == 1 and all(bases.values())
    groups = [m for _, _, m in read_topic(bootstrap, topics.trajectories) if isinstance(m, TrajectoryGroup)]
    # one pool: every group of both roles was written by the solver's node
    assert groups and {g.node_id for g in groups} == {"raas-solver-0"}, {g.node_id for g in groups}
    for p in cfg.policy_names:
        batches = [b for _, _, b in read_topic(bootstrap, topics.batches(p)) if isinstance(b, Batch)]
        assert len(batches) == 4 and all(g.policy == p and g.role == p for b in batches for g in b.groups)
        own = [v for b in batches for g in b.groups for s in g.samples for v in s.own_versions()]
        # each role's tokens carry its own policy's versions: never ahead of the batch that
        # trains them, and past 0 (the node took its policy's new adapters into that slot)
        for b in batches:
            for g in b.groups:
                for s in g.samples:
                    assert max(s.own_versions()) <= b.step, (p, b.step, s.own_versions())
        assert max(own) >= 1, (p, sorted(set(own)))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_topology_places_one_pool_and_one_trainer_process_for_both_lora_policies(bootstrap, tmp_path):
    """`astraflow launch` of examples/topology_solver_verifier_lora_shared.yaml with the verifier
    also trained in the solver's trainer process (trainer.process: solver; its trainer pool
    removed): one RaaS pool and one trainer process for two policies. The pool's node plays both
    roles, the one trainer process trains and announces both adapters, the audit holds."""
    from astraflow.config import load_config
    from astraflow.launcher import launch
    from astraflow.topics import Batch, TrajectoryGroup, VersionAnnouncement, job_topics
    from astraflow.topics.replay import read_topic

    data = yaml.safe_load((ROOT / "examples" / "solver_verifier_lora_shared.yaml").read_text())
    data.update({"job": f"lora-shared-topo-{uuid.uuid4().hex[:8]}", "run_dir": str(tmp_path / "runs")})
    data["rollout"].update({"tasks_per_call": 4, "heartbeat_s": 1.0})
    data["dataflow"] = {"groups_per_batch": 4, "max_staleness": 1}
    data["trainer"].update({"steps": 3, "checkpoint_every": 3, "snapshot_every": 2})
    data["policies"]["verifier"]["trainer"]["process"] = "solver"
    data["eval"] = {"every": 0, "problems": 20, "k": 1, "threads": 1}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    topo = yaml.safe_load((ROOT / "examples" / "topology_solver_verifier_lora_shared.yaml").read_text())
    topo["autoscaler"]["enabled"] = False
    topo["regions"]["local"]["pools"].pop("verifier-trainer")
    topo_path = tmp_path / "topology.yaml"
    topo_path.write_text(yaml.safe_dump(topo))

    run_dir = tmp_path / "run"
    summary = launch(topo_path, cfg, bootstrap=bootstrap, run_dir=run_dir, progress=False, timeout_s=700)
    assert summary["error"] is None, summary["error"]
    assert summary["audit"]["ok"] is True and set(summary["audit"]["final"]["counts"]) >= {"solver", "verifier"}, \
        summary["audit"]
    topics = job_topics(cfg)
    groups = [m for _, _, m in read_topic(bootstrap, topics.trajectories) if isinstance(m, TrajectoryGroup)]
    assert {g.node_id for g in groups} == {"solver-raas-0"}, {g.node_id for g in groups}
    assert {g.role for g in groups} == {"solver", "verifier"}
    for p in cfg.policy_names:  # both trained: every step's batch, and its versions announced
        batches = [b for _, _, b in read_topic(bootstrap, topics.batches(p)) if isinstance(b, Batch)]
        assert len(batches) == 3, (p, len(batches))
        anns = [a for _, _, a in read_topic(bootstrap, topics.versions)
                if isinstance(a, VersionAnnouncement) and a.policy == p]
        assert max(a.version for a in anns) == 3, (p, sorted(a.version for a in anns))
    logs = sorted(f.name for f in (run_dir / "logs").glob("*trainer*.log"))
    assert logs == ["solver-trainer.log"], logs  # one trainer process
