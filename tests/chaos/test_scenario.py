"""Chaos scenario files: the shipped ones load; bad ones fail naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from astraflow.chaos.scenario import KINDS, ScenarioError, check_against_job, load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "chaos" / "scenarios").glob("*.yaml"))
JOB = str(ROOT / "examples" / "arithmetic_grpo.yaml")


def _write(tmp_path: Path, data: dict, name: str = "sc.yaml") -> Path:
    data = {"job": {"config": JOB}, **data}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _error(tmp_path: Path, data: dict) -> ScenarioError:
    path = _write(tmp_path, data)
    with pytest.raises(ScenarioError) as e:
        load_scenario(path)
    assert str(path) in str(e.value)
    return e.value


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenarios_load_and_their_jobs_too(path):
    from astraflow.config import load_config
    sc = load_scenario(path)
    cfg = load_config(sc.job_config, sc.overrides)
    check_against_job(sc, cfg.rollout.nodes)
    assert sc.faults or sc.random


def test_shipped_scenarios_cover_every_fault_kind_but_the_rogue():
    kinds = set()
    for path in SCENARIOS:
        sc = load_scenario(path)
        kinds |= {f.kind for f in sc.faults} | set(sc.random.kinds if sc.random else ())
    assert kinds == set(KINDS) - {"rogue_batch"}


def test_the_soak_runs_half_an_hour_of_random_faults_every_30_s():
    sc = load_scenario(ROOT / "chaos" / "scenarios" / "soak.yaml")
    assert sc.duration_s >= 1800 and sc.random.every_s == 30
    assert len(sc.random.kinds) >= 4


def test_a_fault_gets_its_kind_defaults_and_a_relative_job_path(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "j.yaml").write_text(Path(JOB).read_text())
    path = tmp_path / "sc.yaml"
    path.write_text(yaml.safe_dump({"job": {"config": "jobs/j.yaml", "set": {"trainer.steps": 3}},
                                    "faults": [{"at_step": 2, "kind": "sigstop", "target": "evaluator"}]}))
    sc = load_scenario(path)
    assert sc.job_config == (tmp_path / "jobs" / "j.yaml").resolve()
    f = sc.faults[0]
    assert (f.kind, f.at_step, f.at_s, f.params) == ("sigstop", 2, None, {"resume_after_s": 15.0})
    assert f.target == "dataflow"  # the evaluator is an actor of the dataflow process
    assert sc.set_args() == ["trainer.steps=3"]


def test_overrides_become_set_arguments_the_node_cli_reads_back(tmp_path):
    from astraflow.cli import _overrides
    sc = load_scenario(_write(tmp_path, {"job": {"config": JOB, "set": {
        "trainer.engine.lr": 1.0e-4, "rollout.engine": {"kind": "cpu", "threads": 1}, "data.ops": "+-"}}}))
    assert _overrides(sc.set_args()) == sc.overrides


@pytest.mark.parametrize("data, key", [
    ({"fautls": []}, "fautls"),
    ({"faults": [{"at_s": 1, "kind": "sigsegv", "target": "raas"}]}, "faults[0].kind"),
    ({"faults": [{"at_s": 1, "kind": "sigkill", "target": "gpu-3"}]}, "faults[0].target"),
    ({"faults": [{"at_s": 1, "kind": "sigkill"}]}, "faults[0].target"),
    ({"faults": [{"at_s": 1, "kind": "sigkill", "target": "raas", "resume_after_s": 3}]},
     "faults[0].resume_after_s"),
    ({"faults": [{"kind": "sigkill", "target": "raas"}]}, "faults[0]"),
    ({"faults": [{"at_s": 1, "at_step": 2, "kind": "sigkill", "target": "raas"}]}, "faults[0]"),
    ({"faults": [{"at_s": -1, "kind": "sigkill", "target": "raas"}]}, "faults[0].at_s"),
    ({"faults": [{"at_s": 1, "kind": "slow_node", "target": "raas", "stopped_frac": 1.5}]},
     "faults[0].stopped_frac"),
    ({"faults": [{"at_s": 1, "kind": "disk_full", "target": "raas"}]}, "faults[0].target"),
    ({"faults": [{"at_s": 1, "kind": "broker_restart", "target": "leadr"}]}, "faults[0].target"),
    ({"faults": [{"at_s": 1, "kind": "broker_loss"}]}, "faults[0]"),  # needs 3 brokers
    ({"brokers": 3, "faults": [{"at_s": 1, "kind": "partition", "target": "raas"}]}, "faults[0]"),
    ({"brokers": 3, "faults": [{"at_s": 1, "kind": "broker_restart", "target": 4}]}, "faults[0].target"),
    ({"brokers": 3, "faults": [{"at_s": 1, "kind": "broker_loss"}, {"at_s": 9, "kind": "broker_loss"}]},
     "faults[1]"),
    ({"brokers": 2}, "brokers"),
    ({"faults": [{"random": {"every_s": 5, "kinds": ["broker_loss"]}}]}, "faults[0].random.kinds[0]"),
    ({"faults": [{"random": {"every_s": 5, "kinds": ["sigkil"]}}]}, "faults[0].random.kinds[0]"),
    ({"faults": [{"random": {"every_s": 5, "targets": ["raas", "brokerz"]}}]}, "faults[0].random.targets[1]"),
    ({"faults": [{"random": {"every_s": 0}}]}, "faults[0].random.every_s"),
    ({"faults": [{"random": {"every_s": 5, "kinds": ["sigstop"], "params": {"sigstop": {"for_s": 3}}}}]},
     "faults[0].random.params.sigstop.for_s"),
    ({"faults": [{"random": {"every_s": 5}}, {"random": {"every_s": 6}}]}, "faults[1]"),
    ({"job": {"config": JOB, "set": {"job": "x"}}}, "job.set.job"),
    ({"job": {"config": "nope.yaml"}}, "job.config"),
    ({"job": {"config": JOB, "sett": {}}}, "job.sett"),
    ({"restart": {"delay": 1}}, "restart.delay"),
])
def test_bad_scenarios_name_the_key(tmp_path, data, key):
    assert _error(tmp_path, data).key == key


def test_a_named_raas_node_must_exist_in_the_job(tmp_path):
    sc = load_scenario(_write(tmp_path, {"faults": [{"at_s": 1, "kind": "sigkill", "target": "raas-2"}]}))
    check_against_job(sc, 3)
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.target: raas-2 does not exist.*2 RaaS node"):
        check_against_job(sc, 2)


def test_missing_file_and_bad_yaml_are_scenario_errors(tmp_path):
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("faults: [unclosed")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(tmp_path / "bad.yaml")


def test_the_cli_checks_a_scenario_and_reports_a_bad_one_as_one_line(tmp_path, capsys):
    from astraflow.cli import main
    from astraflow.errors import EXIT_FATAL
    assert main(["chaos", str(SCENARIOS[0]), "--check"]) == 0
    assert "valid" in capsys.readouterr().out
    bad = _write(tmp_path, {"faults": [{"at_s": 1, "kind": "sigsegv", "target": "raas"}]})
    assert main(["chaos", str(bad), "--check"]) == EXIT_FATAL
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"astraflow: error: {bad}: faults[0].kind: unknown fault kind 'sigsegv' (known: "
                   f"{', '.join(KINDS)})"]


def test_broker_faults_can_target_the_coordinators(tmp_path):
    sc = load_scenario(_write(tmp_path, {"brokers": 3, "faults": [
        {"at_step": 1, "kind": "broker_loss", "target": "coordinator"}]}))
    assert sc.faults[0].target == "coordinator"
    sc = load_scenario(_write(tmp_path, {"brokers": 3, "faults": [
        {"at_step": 1, "kind": "broker_restart", "target": "txn_coordinator"}]}))
    assert sc.faults[0].target == "txn_coordinator"


@pytest.mark.parametrize("key, hash_code", [("abc", 96354), ("af.j.raas.policy", None), ("", 0)])
def test_the_coordinator_partition_is_kafkas_string_hash(key, hash_code):
    """Kafka places a group (transactional id) on partition abs(String.hashCode) % partitions."""
    from astraflow.chaos.faults import coordinator_partition
    h = 0
    for ch in key:  # Java's String.hashCode, in 32-bit two's complement
        h = (h * 31 + ord(ch)) % 2**32
    signed = h - 2**32 if h >= 2**31 else h
    if hash_code is not None:
        assert signed == hash_code
    assert coordinator_partition(key, 50) == abs(signed) % 50
    assert coordinator_partition("abc", 50) == 96354 % 50 == 4
