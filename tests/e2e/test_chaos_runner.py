"""``astraflow chaos``: real brokers, real component processes, real faults, then the audit.

One shipped scenario runs through the runner end to end and must pass; a deliberately
broken component (a rogue writer that sends a batch twice, as a faulty dataflow would)
must make the same runner fail: the audit names the twice-settled groups and the command
exits 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from astraflow.chaos.runner import run_scenario

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "chaos" / "scenarios"


# Slow tier (`make test-all`): 144-156 s, which brought `make test` to its 15-minute budget on CI.
# `make test` keeps a SIGKILLed component (tests/e2e/test_multi_policy.py's pool), the
# redelivery tests of tests/topics/ and this runner's failing arm (the rogue batch below).
@pytest.mark.timeout(1500)
def test_every_fault_kind_in_one_job_loses_nothing(tmp_path):
    """A RaaS node, the trainer and the dataflow SIGKILLed and restarted, then the broker
    coordinating the RaaS nodes' group lost for good (3 nodes), in one job."""
    report = run_scenario(SCENARIOS / "every_kind.yaml", run_dir=tmp_path / "run", progress=False)
    assert report["ok"], (report["error"], report["audit"]["violations"], report["weights"])
    assert not report["faults_not_injected"] and report["faults_injected"] == 4
    assert [(f["kind"], f["target"]) for f in report["faults"]][:3] == \
        [("sigkill", "raas-0"), ("sigkill", "trainer"), ("sigkill", "dataflow")]
    assert report["faults"][3]["kind"] == "broker_loss" and report["faults"][3]["target"].startswith("broker-")
    assert report["samples_lost"] == 0 and report["duplicates_trained"] == 0
    assert report["audit"]["batches"] == 8
    assert {"raas-0", "trainer", "dataflow"} <= set(report["component_restarts"])
    assert report["weights"]["match"]


@pytest.mark.timeout(900)
def test_a_sigkilled_raas_node_loses_nothing_through_the_runner(tmp_path):
    report = run_scenario(SCENARIOS / "raas_sigkill.yaml", run_dir=tmp_path / "run", progress=False,
                          report_path=tmp_path / "report.json")
    assert json.loads((tmp_path / "report.json").read_text()) == report
    assert report["ok"], (report["error"], report["audit"]["violations"], report["weights"])
    assert report["faults_by_kind"] == {"sigkill": 1} and not report["faults_not_injected"]
    assert report["samples_lost"] == 0 and report["duplicates_trained"] == 0
    assert report["audit"]["batches"] == 6
    assert report["component_restarts"] == {"raas-0": 1}  # the runner's supervisor brought it back
    fault = report["faults"][0]
    assert fault["target"] == "raas-0" and fault["recovery_s"] is not None
    # the restarted node, its peer and the evaluator all ended on the trainer's final weights
    assert set(report["weights"]["nodes"]) == {"raas-0", "raas-1", "evaluator (dataflow)"}
    assert report["weights"]["match"]
    assert report["tasks_redelivered"] <= fault["tasks_at_risk"]


# broker_restart and disk_full found, on a single broker, tasks answered twice across the
# rebalance after the broker came back: a node that fell out of its group committed (under
# generation -1, which the broker accepts) tasks whose partition's new owner was redoing them.
# Fixed in Producer.send_offsets (tests/topics/test_membership_fencing.py reproduces it).
SHORT = ["components", "partition", "slow_node", "broker_loss", "broker_restart", "disk_full"]


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("name", SHORT)
def test_every_shipped_short_scenario_passes(name, tmp_path):
    """Each fault kind in at least one scenario, with the audit passing (the soak is not run here)."""
    if name == "disk_full" and os.geteuid() != 0:
        pytest.skip("disk_full mounts a tmpfs on the broker's data dir: root only")
    report = run_scenario(SCENARIOS / f"{name}.yaml", run_dir=tmp_path / "run", progress=False)
    assert report["ok"], (report["error"], report["audit"]["violations"], report["weights"])
    assert not report["faults_not_injected"]
    assert report["faults_injected"] == len(report["faults"]) >= 1
    assert report["samples_lost"] == 0 and report["duplicates_trained"] == 0


@pytest.mark.timeout(900)
@pytest.mark.core
def test_a_rogue_duplicate_batch_fails_the_audit_and_the_runner(tmp_path, bootstrap):
    scenario = tmp_path / "rogue.yaml"
    scenario.write_text(yaml.safe_dump({
        "job": {"config": str(ROOT / "examples" / "arithmetic_grpo.yaml"), "set": {
            "trainer.steps": 5, "trainer.checkpoint_every": 1, "trainer.engine.threads": 1,
            "rollout.n_samples": 4, "rollout.max_new_tokens": 6, "rollout.tasks_per_call": 4,
            "rollout.heartbeat_s": 1.0, "dataflow.groups_per_batch": 4,
            "eval.every": 0, "eval.problems": 20, "eval.k": 1}},
        # settle_s bounds the wait for a passing audit: this one never passes (a group settled twice
        # stays so), so the runner waits all of it; the batches are all on the topics once the job is done
        "timeout_s": 600, "settle_s": 5,
        # the copy takes the next step's number: the trainer trains it (groups twice), then
        # dead-letters the dataflow's real batch of that step as a repeat and trains on
        "restart": {"delay_s": 1, "max": 1},
        "faults": [{"at_step": 2, "kind": "rogue_batch"}]}))
    out = subprocess.run([sys.executable, "-m", "astraflow", "chaos", str(scenario), "--bootstrap-servers",
                          bootstrap, "--run-dir", str(tmp_path / "run"), "--report", str(tmp_path / "report.json")],
                         capture_output=True, text=True, timeout=840)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert not report["ok"] and not report["audit"]["ok"]
    assert report["faults_by_kind"] == {"rogue_batch": 1}
    assert report["duplicates_trained"] >= 1
    assert any("settled 2 times" in v for v in report["audit"]["violations"]), report["audit"]["violations"]
    assert "FAIL" in out.stdout and "duplicates trained" in out.stdout
