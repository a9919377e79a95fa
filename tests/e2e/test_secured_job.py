"""A job on the secured broker, every component logged in as its own role under its ACLs.

`astraflow acl apply --users` gives each role of the job's config its SCRAM credential and
only the ACLs `astraflow acl plan` lists; the launcher (admin), dataflow, trainer and RaaS
node then run the whole job with nothing more. A right missing from the plan fails it.
"""

from __future__ import annotations

import pytest

from astraflow.cli import main
from astraflow.topics import security

pytestmark = pytest.mark.slow

ROLES = ("raas", "trainer", "dataflow", "admin")


def test_a_small_job_runs_with_each_component_under_its_own_acls(secure_broker, make_job_config, tmp_path,
                                                                 monkeypatch, capsys):
    from astraflow.launcher import run_job
    bootstrap, setup = secure_broker.bootstrap_servers, secure_broker.secure
    for role in ROLES:
        (tmp_path / f"{role}.pw").write_text(f"pw-{role}-{tmp_path.name}\n")
    cfg = make_job_config({"kafka": {"bootstrap_servers": bootstrap, "security": {
        "protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "ca_file": str(setup.ca_file),
        "principals": {r: {"username": f"{tmp_path.name[:20]}-{r}", "password_file": f"{r}.pw"} for r in ROLES}}}})
    for k, v in (("SECURITY_PROTOCOL", "SASL_SSL"), ("SASL_MECHANISM", "SCRAM-SHA-512"), ("USERNAME", "admin"),
                 ("PASSWORD_FILE", str(setup.password_file)), ("CA_FILE", str(setup.ca_file))):
        monkeypatch.setenv(f"ASTRAFLOW_KAFKA_{k}", v)
    assert main(["acl", "apply", "--config", cfg.source, "--users"]) == 0
    for k in ("SECURITY_PROTOCOL", "SASL_MECHANISM", "USERNAME", "PASSWORD_FILE", "CA_FILE"):
        monkeypatch.delenv(f"ASTRAFLOW_KAFKA_{k}")  # from here on only the config's principals
    security.uninstall()
    try:
        summary = run_job(cfg, bootstrap=bootstrap, run_dir=tmp_path / "run", progress=False, timeout_s=600)
    finally:
        security.uninstall()
    assert summary["steps_trained"] == cfg.trainer.steps, summary
    assert summary["audit"]["ok"], summary["audit"]
    for log in ("dataflow", "trainer", "raas-0"):  # each process logged in as its role's principal, no other
        role = log.split("-")[0]
        text = (tmp_path / "run" / "logs" / f"{log}.log").read_text()
        assert f"kafka clients: SASL_SSL (SCRAM-SHA-512 as '{tmp_path.name[:20]}-{role}')" in text
        assert f"pw-{role}" not in text


def test_astraflow_run_secures_its_own_embedded_broker(make_job_config, tmp_path):
    """`kafka.security.embedded: true`: the broker `astraflow run` starts is SASL_SSL with ACLs per
    principal; the job runs to its last step with each component logged in as its own user; on
    that broker (restarted on the run's data dir) a client without credentials is refused and
    the RaaS principal may write trajectories but not `versions` or its weights."""
    import stat

    from astraflow.launcher import run_job
    from astraflow.topics import EmbeddedBroker, Producer, job_topics
    from astraflow.topics.messages import Metric
    from astraflow.topics.secured import SecureSetup

    cfg = make_job_config({"kafka": {"security": {"embedded": True}}})
    run_dir = tmp_path / "run"
    security.uninstall()
    try:
        summary = run_job(cfg, run_dir=run_dir, progress=False, timeout_s=600)
    finally:
        security.uninstall()
    assert summary["steps_trained"] == cfg.trainer.steps, summary
    assert summary["audit"]["ok"], summary["audit"]
    secure = run_dir / "secure"
    assert stat.S_IMODE(secure.stat().st_mode) == 0o700
    assert stat.S_IMODE((secure / "users").stat().st_mode) == 0o700
    passwords = {p.name: p.read_text().strip() for p in (secure / "users").glob("*.password")}
    assert set(passwords) == {"admin.password", "dataflow.password", f"raas.{cfg.policy}.password",
                              f"trainer.{cfg.policy}.password"}
    assert all(stat.S_IMODE((secure / "users" / n).stat().st_mode) == 0o600 for n in passwords)
    assert stat.S_IMODE((secure / "admin.password").stat().st_mode) == 0o600  # the super user's
    for log, user in (("dataflow", "af-dataflow"), ("trainer", f"af-trainer-{cfg.policy}"),
                      ("raas-0", f"af-raas-{cfg.policy}")):
        text = (run_dir / "logs" / f"{log}.log").read_text()
        assert f"kafka clients: SASL_SSL (SCRAM-SHA-512 as '{user}')" in text, log
        assert not any(pw in text for pw in passwords.values()), log

    setup = SecureSetup.create(secure)  # the run's own CA and super user
    topics = job_topics(cfg)
    with EmbeddedBroker(run_dir / "kafka", heap="512m", startup_timeout=300, secure=setup) as broker:
        bootstrap = broker.bootstrap_servers
        try:
            for bad, says in ((security.ClientSecurity(), "the listener wants TLS"),
                              (security.ClientSecurity(protocol="SSL", ca_file=str(setup.ca_file)),
                               "the listener wants SASL")):
                security.install(bad)
                with pytest.raises(security.KafkaAuthError, match=says):
                    Producer(bootstrap, client_id="test-no-credentials")
            raas_user = f"af-raas-{cfg.policy}"
            security.install(security.with_credentials(setup.client_security(), raas_user,
                                                       passwords[f"raas.{cfg.policy}.password"]))
            record = Metric(component="raas", name="m", value=1.0)
            with Producer(bootstrap, client_id="test-raas") as p:
                p.send_sync(topics.trajectories, record)  # its credential and ACLs work
                for topic in (topics.versions, topics.weights(cfg.policy)):
                    with pytest.raises(Exception) as refused:
                        p.send_sync(topic, record, key=cfg.policy)
                    assert "TopicAuthorizationFailed" in f"{type(refused.value.__cause__).__name__} {refused.value}", topic
        finally:
            security.uninstall()
