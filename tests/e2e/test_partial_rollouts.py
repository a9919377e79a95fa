"""Partial rollouts in a real job (``rollout.partial: true``): new versions land mid-generation,
rows go on under them, a RaaS node is SIGKILLed mid-row, and the topics still keep the
conservation law and the staleness bound (counted from each sample's oldest token).

Each node's engine waits 50 ms between tokens (the ``raas.between_tokens`` fault point, a test
hook: :mod:`astraflow.chaos.hooks`), so a call outlasts a trainer step on the tiny model and
versions arrive while rows are in flight, as they do on long generations.
"""

from __future__ import annotations

import pytest

from astraflow.chaos.hooks import SLOW_TOKENS
from astraflow.topics import TrajectoryGroup, ensure_topics, job_topics
from astraflow.topics.replay import read_topic

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_rows_span_versions_and_a_kill_mid_row_loses_nothing(make_job_config, bootstrap, tmp_path, monkeypatch):
    from astraflow.chaos.harness import JobHarness

    monkeypatch.setenv(SLOW_TOKENS, "*:0.05")
    cfg = make_job_config({"trainer": {"steps": 8}, "rollout": {"partial": True, "max_new_tokens": 10}},
                          name="partial")
    ensure_topics(bootstrap, job_topics(cfg).specs())
    h = JobHarness(cfg, bootstrap, tmp_path / "run")
    try:
        for role, node in (("dataflow", "dataflow"), ("trainer", "trainer"), ("raas", "raas-0"), ("raas", "raas-1")):
            h.start(role, node)
        # raas-0 has continued rows under a newer version: kill it while it generates
        h.wait_for(lambda m: m.name == "raas.partial_rows" and m.labels.get("node") == "raas-0", 400,
                   "raas-0 continuing rows across a version")
        h.kill("raas-0")
        h.wait_for(lambda m: m.name == "trainer.done", 600, "trainer.done")
        assert h.wait_exit("trainer", 60) == 0
        report = h.audit_until_settled()
    finally:
        h.stop_all()
    assert report.ok, report.violations[:10]
    assert report.batches == cfg.trainer.steps
    assert report.max_staleness_seen <= cfg.effective_staleness  # from each sample's oldest token
    freed = report.drops["failed"] + report.drops["stale"]
    assert report.tasks == report.groups == cfg.trainer.steps * cfg.dataflow.groups_per_batch + freed
    groups = [m for _, _, m in read_topic(bootstrap, h.topics.trajectories) if isinstance(m, TrajectoryGroup)]
    spanning = [s for g in groups for s in g.samples if len(set(s.versions)) > 1]
    assert spanning, "no sample spans two versions: the partial path never ran"
    for s in spanning:  # versions only move forward within a row
        assert list(s.versions) == sorted(s.versions)
