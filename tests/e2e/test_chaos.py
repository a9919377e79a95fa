"""Kill real component processes mid-run; the topics must show nothing lost or duplicated.

Each test ends with the conservation audit (every task settled exactly once: its group is
in one batch or named by one drop record) and an exact count of what was scheduled.
"""

from __future__ import annotations

import json

import pytest

from astraflow.chaos.harness import JobHarness
from astraflow.chaos.invariants import audit
from astraflow.topics import ensure_topics, job_topics

pytestmark = pytest.mark.slow


def _assert_conserved(report, cfg) -> None:
    assert report.ok, report.violations[:10]
    assert report.batches == cfg.trainer.steps
    # the horizon plus one replacement per group dropped as failed or stale; nothing unneeded
    freed = report.drops["failed"] + report.drops["stale"]
    assert report.tasks == report.groups == cfg.trainer.steps * cfg.dataflow.groups_per_batch + freed


def _start(cfg, bootstrap, tmp_path, raas: int):
    ensure_topics(bootstrap, job_topics(cfg).specs())
    h = JobHarness(cfg, bootstrap, tmp_path / "run")
    h.start("dataflow", "dataflow")
    h.start("trainer", "trainer")
    for i in range(raas):
        h.start("raas", f"raas-{i}")
    return h


def test_sigkilled_raas_node_tasks_are_redelivered(make_job_config, bootstrap, tmp_path):
    cfg = make_job_config({"trainer": {"steps": 6}}, name="chaos-raas")
    h = _start(cfg, bootstrap, tmp_path, raas=2)
    try:
        h.wait_for(lambda m: m.name == "raas.tasks" and m.labels.get("node") == "raas-0", 300, "raas-0 working")
        h.kill("raas-0")
        h.wait_for(lambda m: m.name == "trainer.done", 600, "trainer.done")
        assert h.wait_exit("trainer", 60) == 0
        # Scheduling stops at the training horizon, so raas-1 drains every task there is,
        # including the ones raas-0 held uncommitted when it died.
        report = h.audit_until_settled()
    finally:
        h.stop_all()
    _assert_conserved(report, cfg)  # every task answered exactly once, none lost with raas-0
    done_by = {m.labels.get("node") for m in h.metrics if m.name == "raas.tasks"}
    assert done_by == {"raas-0", "raas-1"}
    # everything scheduled after the kill was still answered: batches could only fill through raas-1
    late = [m for m in h.metrics if m.name == "raas.tasks" and m.labels.get("node") == "raas-1"]
    assert late


def test_trainer_killed_and_restarted_resumes_from_checkpoint(make_job_config, bootstrap, tmp_path):
    cfg = make_job_config({"trainer": {"steps": 10, "checkpoint_every": 2}}, name="chaos-trainer")
    h = _start(cfg, bootstrap, tmp_path, raas=1)
    try:
        h.wait_for(lambda m: m.name == "trainer.samples" and m.step >= 3, 300, "trainer step 3")
        h.kill("trainer")
        h.start("trainer", "trainer")
        resumed = h.wait_for(lambda m: m.name == "trainer.resumed_step" and m.value > 0, 300, "resume")
        h.wait_for(lambda m: m.name == "trainer.done", 600, "trainer.done")
        assert h.wait_exit("trainer", 60) == 0
    finally:
        h.stop_all()
    # resumed from the newest checkpoint before the kill, not from scratch and not from the end
    assert resumed.value % cfg.trainer.checkpoint_every == 0 and 0 < resumed.value < cfg.trainer.steps
    ckpt = tmp_path / "run" / "checkpoints" / cfg.policy
    lineage = _lineage(ckpt)
    assert [step for step, _ in lineage] == list(range(cfg.trainer.steps))  # none twice, none skipped
    offsets = [off for _, off in lineage]
    assert offsets == sorted(set(offsets))
    _assert_conserved(audit(bootstrap, h.topics, cfg.policy, cfg.effective_staleness), cfg)


def _lineage(ckpt_dir):
    return json.loads((ckpt_dir / "progress.json").read_text())["lineage"]


def test_dataflow_killed_and_restarted_rebuilds_its_state_from_the_topics(make_job_config, bootstrap, tmp_path):
    cfg = make_job_config({"trainer": {"steps": 8}}, name="chaos-dataflow")
    h = _start(cfg, bootstrap, tmp_path, raas=1)
    try:
        h.wait_for(lambda m: m.name == "dataflow.batch_reward" and m.step >= 2, 300, "batch 2")
        h.kill("dataflow")
        h.start("dataflow", "dataflow")
        h.wait_for(lambda m: m.name == "trainer.done", 600, "trainer.done")
        assert h.wait_exit("trainer", 60) == 0
    finally:
        h.stop_all()
    # the restarted dataflow resumed the schedule instead of starting over or scheduling twice
    _assert_conserved(audit(bootstrap, h.topics, cfg.policy, cfg.effective_staleness), cfg)
    # ... from one state record, not from the batches topic
    resumed = [m for m in h.metrics if m.name == "dataflow.resumed"]
    assert [m.labels["state_records_read"] for m in resumed] == [0, 1]
    assert resumed[1].value >= 3  # killed after batch 2 was written
