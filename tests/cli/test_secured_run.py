"""`kafka.security.embedded: true`: what a run makes for its own secured broker (fast half).

The run dir's ``secure/`` holds one password file per principal (0600, in a 0700 folder); the
components' ``--set`` overrides give each the same setting with file names only; the plan gives
a RaaS principal no write on ``versions`` or ``weights.*``. The run itself on the secured
broker: tests/e2e/test_secured_job.py.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from astraflow.cli.args import overrides as _overrides
from astraflow.config import load_config
from astraflow.secured_run import SecuredRun, principal_users
from astraflow.topics import job_topics
from astraflow.topics.acls import plan
from astraflow.typed_config import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _job(tmp_path: Path, kafka: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"job: emb\nrun_dir: {tmp_path / 'runs'}\nkafka:\n{kafka}")
    return path


@pytest.mark.parametrize("kafka, key", [
    ("  security: {embedded: true, protocol: SASL_SSL}\n", "kafka.security.protocol"),
    ("  security:\n    embedded: true\n    principals: {raas: {username: r, password_env: X}}\n",
     "kafka.security.principals"),
    ("  bootstrap_servers: 127.0.0.1:9092\n  security: {embedded: true}\n", "kafka.security.embedded"),
])
def test_embedded_with_settings_of_its_own_or_a_cluster_is_a_config_error(tmp_path, kafka, key):
    with pytest.raises(ConfigError) as e:
        load_config(_job(tmp_path, kafka))
    assert str(tmp_path / "job.yaml") in str(e.value) and key in str(e.value), str(e.value)


def test_a_run_makes_a_private_password_file_per_principal_and_overrides_naming_only_files(tmp_path):
    cfg = load_config(_job(tmp_path, "  security: {embedded: true}\n"))
    run = SecuredRun.create(cfg, tmp_path / "run")
    assert set(run.users) == {"admin", "dataflow", f"raas.{cfg.policy}", f"trainer.{cfg.policy}"}
    assert stat.S_IMODE(run.setup.dir.stat().st_mode) == stat.S_IMODE((run.setup.dir / "users").stat().st_mode) == 0o700
    for key, path in run.password_files.items():
        assert path.parent == (run.setup.dir / "users").resolve() and stat.S_IMODE(path.stat().st_mode) == 0o600, key
    passwords = {path.read_text().strip() for path in run.password_files.values()}
    assert len(passwords) == len(run.users)  # each its own
    again = SecuredRun.create(cfg, tmp_path / "run")  # the same run dir keeps them (its broker's users)
    assert {p.read_text() for p in again.password_files.values()} == {p.read_text() for p in run.password_files.values()}
    assert not any(pw in " ".join(run.overrides()) for pw in passwords)
    # A component loads the job file with the overrides: it logs in as its own principal.
    node = load_config(cfg.source, _overrides(run.overrides()))
    assert not node.kafka.security.embedded and node.kafka.security == run.security()
    raas = node.kafka.security.client("raas", node.config_dir, node.source, policy=cfg.policy)
    assert raas.username == f"af-raas-{cfg.policy}" and raas.password in passwords
    assert raas.ca_file == str(run.setup.ca_file.resolve())


def test_the_runs_plan_gives_raas_no_write_on_versions_or_weights(tmp_path):
    cfg = load_config(_job(tmp_path, "  security: {embedded: true}\n"))
    topics, users = job_topics(cfg), principal_users(cfg)
    raas = f"User:{users[f'raas.{cfg.policy}']}"
    writes = {(e.name, e.pattern) for e in plan(topics, users) if e.principal == raas
              and e.operation in ("WRITE", "ALL") and e.resource == "TOPIC"}
    assert writes and (topics.versions, "LITERAL") not in writes
    assert not any(topics.weights(cfg.policy).startswith(n) for n, p in writes if p == "PREFIXED")
    assert (topics.weights(cfg.policy), "LITERAL") not in writes
    tids = {e.name for e in plan(topics, users) if e.principal == raas and e.resource == "TRANSACTIONAL_ID"}
    assert tids == {topics.rollout_transactional_id(cfg.policy, "")}  # its policy's ids, even as the only policy


def test_make_demo_can_run_the_demo_secured():
    assert "kafka.security.embedded=true" in (ROOT / "Makefile").read_text()


@pytest.mark.slow
def test_a_secured_runs_kafka_log_still_opens_offline(tmp_path):
    """`astraflow status`/`replay` of a finished run dir reopen its Kafka log on a local plaintext
    broker (astraflow.offline): a log formatted and written by the run's secured broker opens too."""
    from kafka import TopicPartition

    from astraflow.offline import OfflineBroker
    from astraflow.topics import Consumer, EmbeddedBroker, JobTopics, Producer, ensure_topics, security
    from astraflow.topics.messages import Metric

    cfg = load_config(_job(tmp_path, "  security: {embedded: true}\n"))
    run = SecuredRun.create(cfg, tmp_path / "run")
    topics = JobTopics(job="off", policies=("p",))
    try:
        with EmbeddedBroker(tmp_path / "run" / "kafka", heap="512m", startup_timeout=300, secure=run.setup) as b:
            security.install(run.setup.client_security())
            ensure_topics(b.bootstrap_servers, topics.specs())
            with Producer(b.bootstrap_servers, client_id="off") as p:
                p.send_sync(topics.metrics, Metric(component="run", name="m", value=7.0))
        security.uninstall()  # the offline reader is a plaintext client of its own local broker
        with OfflineBroker(tmp_path / "run") as bootstrap:
            c = Consumer(bootstrap, partitions=[TopicPartition(topics.metrics, 0)], client_id="off-read")
            try:
                got = []
                for _ in range(60):
                    got += [d.message.value for d in c.poll(timeout_ms=500)]
                    if got:
                        break
            finally:
                c.close()
        assert got == [7.0]
    finally:
        security.uninstall()
