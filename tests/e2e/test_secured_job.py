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
