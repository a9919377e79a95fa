"""`astraflow run` audits its own job: the verdict in summary.json and on the done line, and a
failed audit makes the command exit non-zero.

The clean case is the shared short run of ``test_job.py`` (audited every 2 versions and at
the end); here one short job is run by the real CLI after an insider holding the RaaS pool's
signing key wrote a trajectory group for a task the dataflow never assigned. The dataflow
drops it as a duplicate and the job trains normally, so only the audit can tell. (A forger
without the key is refused before that: tests/actors/test_dataflow_lanes.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from astraflow.actors.signing import group_signer_for, with_run_keys
from astraflow.topics import Producer, Sample, TrajectoryGroup, ensure_topics, job_topics

pytestmark = pytest.mark.slow


def test_the_done_line_carries_the_verdict():
    from astraflow.cli import done_line
    from astraflow.job_audit import Verdict, audit_summary
    base = {"steps_trained": 2, "wall_s": 30.0, "accuracy_by_version": {"0": 0.1, "2": 0.2}}
    counts = {"policy": {"tasks": 9, "groups": 9, "batches": 2, "batched_groups": 8, "replayed_groups": 0,
                         "failed_groups": 0, "drops": {"duplicate": 1}, "max_staleness_seen": 1}}
    ok = audit_summary(Verdict(True, True, 2, 0, (), counts), [])
    assert done_line({**base, "audit": ok}, "policy").endswith(
        "v0:0.100 -> v2:0.200; conservation audit ok (9 tasks, 8 groups in 2 batches, 1 dropped)")
    bad = audit_summary(Verdict(True, True, 4, 0, (), counts), [Verdict(False, False, 2, 1, ("task t1 scheduled 2 times",))])
    assert bad["ok"] is False
    assert done_line({**base, "audit": bad}, "policy").endswith(
        "conservation audit FAILED at v2: task t1 scheduled 2 times")
    skipped = audit_summary(None, [], "interrupted")
    assert skipped["ok"] is None and "not run (interrupted)" in done_line({**base, "audit": skipped}, "policy")


@pytest.mark.core
def test_a_forged_group_fails_the_runs_audit_and_its_exit_status(bootstrap, make_job_config, tmp_path):
    cfg = make_job_config({"trainer": {"steps": 2}, "eval": {"problems": 20, "k": 1}}, name="forged")
    topics = job_topics(cfg)
    ensure_topics(bootstrap, topics.specs())
    forged = TrajectoryGroup("forged-task-0", "forged-prompt", cfg.policy, "forger", [1, 2],
                             [Sample([5, 6], [-0.1, -0.2], [0, 0], 1.0, "stop")] * cfg.rollout.n_samples)
    run_dir = tmp_path / "run"
    signer = group_signer_for(with_run_keys(cfg, run_dir))  # the run's own pool key, which the run then uses
    p = Producer(bootstrap, client_id="forger")
    try:
        p.send_sync(topics.trajectories, forged, key=forged.task_id,
                    headers=signer.headers_for(topics.trajectories, forged))
    finally:
        p.close()
    out = subprocess.run([sys.executable, "-m", "astraflow", "run", cfg.source, "--bootstrap-servers", bootstrap,
                          "--run-dir", str(run_dir), "--quiet"], capture_output=True, text=True, timeout=900)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps_trained"] == 2 and summary["error"] is None, out.stderr[-2000:]  # the job itself ran
    assert out.returncode == 3, (out.returncode, out.stderr[-2000:])  # EXIT_FATAL: rerunning fails the same way
    audit = summary["audit"]
    assert audit["ok"] is False and audit["final"]["final"] is True
    assert audit["final"]["violations"] == ["trajectory group for unknown task forged-task-0"]
    # the dataflow kept it out of training: a task id it never wrote, refused as such and counted
    assert audit["final"]["counts"]["policy"]["drops"] == {"unknown_task": 1}
    assert audit["final"]["counts"]["policy"]["rejected_groups"] == {"unknown_task": 1}
    done = [line for line in out.stdout.splitlines() if line.startswith("done:")]
    assert done and done[-1].endswith("conservation audit FAILED: 1 violation(s), first: trajectory group for "
                                      "unknown task forged-task-0")
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("astraflow: error: the conservation audit of the finished job failed: trajectory group "
                           "for unknown task forged-task-0"), last
    # the same finding fails an audit of the running job too (it is definitive, not work in flight):
    # with audit.every_versions the launcher's loop gets the error that stops the job
    import dataclasses

    from astraflow.config import AuditConfig
    from astraflow.job_audit import AuditFailed, PeriodicAudit
    periodic = PeriodicAudit(bootstrap, dataclasses.replace(cfg, audit=AuditConfig(every_versions=1)))
    assert periodic.tick(0) is None and periodic.tick(2) is None  # none due at v0; the one due at v2 runs aside
    failed = periodic.finish()
    assert isinstance(failed, AuditFailed) and "the running job at v2" in str(failed)
    assert [(v.final, v.version, v.violations) for v in periodic.verdicts] == \
        [(False, 2, ("trajectory group for unknown task forged-task-0",))]
