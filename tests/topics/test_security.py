"""Client security (kafka.security, ASTRAFLOW_KAFKA_*) and the secured embedded broker.

Every Kafka client of the project is made by astraflow.topics.security (a scan of the
source fails on one made elsewhere); a job config's security section is checked at load
time; against a real SASL_SSL broker with ACLs enforced, the right credentials round-trip
records, wrong ones are refused in one line, and a component principal may do only what
`astraflow acl plan` gave it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import socket
import threading
import uuid
from pathlib import Path

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaError, TopicAuthorizationFailedError

from astraflow.cli.config import describe
from astraflow.config import install_security, load_config
from astraflow.topics import JobTopics, Producer, ensure_topics, security
from astraflow.topics.acls import apply, plan
from astraflow.topics.consumer import Consumer
from astraflow.topics.messages import Metric
from astraflow.topics.secured import add_users
from astraflow.typed_config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = {"KafkaConsumer", "KafkaProducer", "KafkaAdminClient"}


@pytest.fixture(autouse=True)
def _no_installed_setting():
    security.uninstall()
    yield
    security.uninstall()


# -- every client goes through topics/security.py -----------------------------------------

def _constructions(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in CLIENTS:
                lines.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kafka"):
            lines += [node.lineno for a in node.names if a.name in CLIENTS and a.asname]  # an alias hides a call
    return lines


def test_no_kafka_client_is_made_outside_topics_security():
    sources = [p for p in ROOT.rglob("*.py")
               if not {".venv", "tests", "build", ".git"} & set(p.relative_to(ROOT).parts)]
    assert len(sources) > 100
    offenders = {str(p.relative_to(ROOT)): lines for p in sources
                 if p != ROOT / "topics" / "security.py" and (lines := _constructions(p))}
    assert not offenders, (f"Kafka clients made without the process's security setting: {offenders}; use "
                           f"astraflow.topics.security.consumer/producer/admin")


def test_the_scan_sees_a_construction_that_bypasses_it(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from kafka import KafkaProducer as P\nimport kafka\nc = kafka.KafkaConsumer()\n")
    assert _constructions(bad) == [3, 1] or sorted(_constructions(bad)) == [1, 3]


# -- kafka.security in the job config ------------------------------------------------------

def _job(tmp_path, security_yaml: str) -> Path:
    path = tmp_path / "job.yaml"
    body = "".join(f"    {line}\n" for line in security_yaml.strip().splitlines())
    path.write_text(f"job: sec\nkafka:\n  bootstrap_servers: 127.0.0.1:9\n  security:\n{body}")
    return path


@pytest.mark.parametrize("yaml_text, key", [
    ("protocol: SASL_SSL", "kafka.security.sasl_mechanism"),
    ("protocol: SASL_SSL\nsasl_mechanism: SCRAM-SHA-512\nusername: u", "kafka.security.password_file"),
    ("protocol: SASL_SSL\nsasl_mechanism: SCRAM-SHA-512\nusername: u\npassword: hunter2", "kafka.security.password"),
    ("protocol: SSL\nusername: u", "kafka.security.username"),
    ("protocol: PLAINTEXT\nca_file: ca.pem", "kafka.security.ca_file"),
    ("protocol: SSL\ncert_file: c.pem", "kafka.security.key_file"),
    ("protocol: SASL_SSL\nsasl_mechanism: MD5\nusername: u\npassword_env: X", "kafka.security.sasl_mechanism"),
    ("protocol: SASL_SSL\nsasl_mechanism: PLAIN\nusername: u\npassword_env: X\nprincipals:\n  robot: "
     "{username: r, password_env: Y}", "kafka.security.principals.robot"),
])
def test_an_invalid_security_section_is_a_config_error_naming_key_and_file(tmp_path, yaml_text, key):
    with pytest.raises(ConfigError) as e:
        load_config(_job(tmp_path, yaml_text))
    assert str(tmp_path / "job.yaml") in str(e.value) and key in str(e.value)
    assert "hunter2" not in str(e.value)


def test_passwords_come_from_a_file_or_a_variable_and_are_never_printed(tmp_path, monkeypatch):
    (tmp_path / "raas.pw").write_text("s3cret-raas\n")
    monkeypatch.setenv("AF_TEST_PW", "s3cret-default")
    cfg = load_config(_job(tmp_path, "protocol: SASL_PLAINTEXT\nsasl_mechanism: SCRAM-SHA-256\nusername: af\n"
                                     "password_env: AF_TEST_PW\nprincipals:\n  raas: {username: af-raas, "
                                     "password_file: raas.pw}"))
    raas, trainer = cfg.kafka.security.client("raas", cfg.config_dir, cfg.source), install_security(cfg, "trainer")
    assert (raas.username, raas.password) == ("af-raas", "s3cret-raas")  # relative to the config's folder
    assert (trainer.username, trainer.password) == ("af", "s3cret-default")
    assert security.current() is trainer and security.client_kwargs()["sasl_plain_username"] == "af"
    printed = json.dumps(dataclasses.asdict(cfg), default=str) + repr(raas) + repr(trainer) + raas.describe()
    assert "s3cret" not in printed
    monkeypatch.delenv("AF_TEST_PW")
    with pytest.raises(ConfigError, match=r"job.yaml: kafka.security.password_env: .*AF_TEST_PW"):
        install_security(cfg, "dataflow")


def test_config_keys_list_the_security_section():
    keys = {k: h for k, _, h in describe()}
    for k in ("protocol", "sasl_mechanism", "username", "password_file", "password_env", "ca_file", "cert_file",
              "key_file", "check_hostname", "principals"):
        assert keys.get(f"kafka.security.{k}"), k


def test_the_probe_asks_the_first_bootstrap_address_that_answers(bootstrap):
    """A cluster that lost the broker listed first: the probe asks the next one, so a refused
    setting is still one line and not kafka-python's bootstrap timeout."""
    from astraflow.topics.broker import free_port
    dead = f"127.0.0.1:{free_port()}"
    assert security.probe(dead, security.ClientSecurity()) == (False, None)  # nothing answers
    assert security.probe(f"{dead},{bootstrap}", security.ClientSecurity()) == (True, None)
    ok, why = security.probe(f"{dead},{bootstrap}", security.ClientSecurity(protocol="SSL"))
    assert not ok and why and bootstrap in why, why  # the answer names the broker that gave it


def _dying_broker(connections: int) -> tuple[str, threading.Thread]:
    """A listener that accepts ``connections`` connections, closes each at once (what a broker
    shutting down does), then stops listening."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        with srv:
            for _ in range(connections):
                conn, _ = srv.accept()
                conn.close()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"127.0.0.1:{srv.getsockname()[1]}", thread


def test_a_broker_closing_connections_as_it_dies_is_not_taken_for_a_refused_setting(bootstrap):
    """A broker being killed accepts a connection and closes it at the first request, as a TLS
    listener does to a plaintext client: the probe asks the next address, and asks again
    before it believes a refusal."""
    dying, thread = _dying_broker(1)
    assert security.probe(f"{dying},{bootstrap}", security.ClientSecurity()) == (True, None)
    thread.join(5)
    dying, thread = _dying_broker(1)  # alone: gone when asked again, so nothing is said
    assert security.probe(dying, security.ClientSecurity()) == (False, None)
    thread.join(5)
    closing, thread = _dying_broker(2)  # refuses the same way twice: a setting it wants
    ok, why = security.probe(closing, security.ClientSecurity())
    assert not ok and "the listener wants TLS" in why and closing in why, why


def test_the_environment_is_the_setting_of_a_command_without_a_config(tmp_path):
    (tmp_path / "pw").write_text("from-file\n")
    sec = security.from_env({"ASTRAFLOW_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                             "ASTRAFLOW_KAFKA_SASL_MECHANISM": "PLAIN", "ASTRAFLOW_KAFKA_USERNAME": "ops",
                             "ASTRAFLOW_KAFKA_PASSWORD_FILE": str(tmp_path / "pw")})
    assert sec.kwargs() == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                            "sasl_plain_username": "ops", "sasl_plain_password": "from-file"}
    assert security.from_env({}).kwargs() == {}
    with pytest.raises(security.SecurityError, match="sasl_mechanism"):
        security.from_env({"ASTRAFLOW_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "ASTRAFLOW_KAFKA_USERNAME": "x",
                           "ASTRAFLOW_KAFKA_PASSWORD": "y"})


# -- the real secured broker -----------------------------------------------------------------

#: A second broker JVM (~25 s to start on an idle machine, over a minute beside the suite): `make test-all`.
slow = pytest.mark.slow


@pytest.fixture
def secured(secure_broker):
    """(bootstrap, the super user's setting, a fresh job's topics created as the super user)."""
    sup = secure_broker.secure.client_security()
    security.install(sup)
    topics = JobTopics(job="s" + uuid.uuid4().hex[:8], policies=("p",), task_partitions=2, trajectory_partitions=2)
    ensure_topics(secure_broker.bootstrap_servers, topics.specs())
    return secure_broker.bootstrap_servers, sup, topics


def _read_all(bootstrap: str, topic: str, n: int, **kw) -> list:
    c = Consumer(bootstrap, partitions=[TopicPartition(topic, p) for p in range(kw.pop("partitions", 1))],
                 client_id="test-read", **kw)
    try:
        got = []
        for _ in range(60):
            got += c.poll(timeout_ms=500)
            if len(got) >= n:
                return got
        return got
    finally:
        c.close()


@slow
@pytest.mark.core  # the secured broker in `make test`: one start, shared by these
def test_the_right_credentials_and_ca_round_trip_records(secured):
    bootstrap, sup, topics = secured
    with Producer(bootstrap, client_id="test-sec") as p:
        p.send_sync(topics.metrics, Metric(component="test", name="m", value=1.0))
    got = _read_all(bootstrap, topics.metrics, 1)
    assert [(d.message.component, d.message.value) for d in got] == [("test", 1.0)]


@slow
@pytest.mark.core  # the secured broker in `make test`: one start, shared by these
@pytest.mark.parametrize("change, says", [
    (lambda s: dataclasses.replace(s, password="not-the-password"), "refused SASL authentication of user 'admin'"),
    (lambda s: security.ClientSecurity(), "the listener wants TLS"),
    (lambda s: dataclasses.replace(s, ca_file=None), "TLS certificate is not trusted"),
    (lambda s: security.ClientSecurity(protocol="SSL", ca_file=s.ca_file), "the listener wants SASL"),
])
def test_a_wrong_setting_is_refused_with_one_clear_line(secure_broker, change, says):
    bad = change(secure_broker.secure.client_security())
    security.install(bad)
    with pytest.raises(security.KafkaAuthError) as e:
        Producer(secure_broker.bootstrap_servers, client_id="test-bad")
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert "not-the-password" not in str(e.value) and secure_broker.secure.super_password not in str(e.value)
    assert e.value.__cause__ is None  # the probe's answer, not a client's timeout after it


@slow
@pytest.mark.core  # the secured broker in `make test`: one start, shared by these
def test_acl_apply_gives_each_principal_only_what_its_role_needs(secured):
    bootstrap, sup, topics = secured
    users = {"raas": f"raas-{topics.job}", "trainer": f"trainer-{topics.job}"}
    passwords = {u: uuid.uuid4().hex for u in users.values()}
    add_users(bootstrap, passwords)
    entries = plan(topics, users)
    assert apply(bootstrap, entries) == len(entries)
    task = Metric(component="t1", name="task", value=1.0)  # any record: the broker judges the topic, not the type
    with Producer(bootstrap, client_id="test-admin") as p:  # the super user writes a task
        p.send_sync(topics.tasks("p"), task)

    def as_user(role: str):
        security.install(security.with_credentials(sup, users[role], passwords[users[role]]))

    as_user("raas")
    got = _read_all(bootstrap, topics.tasks("p"), 1, partitions=2)  # it reads its tasks
    assert [d.message.component for d in got] == ["t1"]
    c = Consumer(bootstrap, topics=[topics.tasks("p")], group_id=topics.rollout_group("p"), client_id="test-raas")
    try:  # in its consumer group
        polled = []
        for _ in range(60):
            polled += c.poll(timeout_ms=500)
            if polled:
                break
        assert [d.message.component for d in polled] == ["t1"]
        c.commit()
    finally:
        c.close()
    with Producer(bootstrap, client_id="test-raas") as p:
        p.send_sync(topics.trajectories, Metric(component="raas", name="m", value=1.0))  # it writes trajectories
        with pytest.raises(Exception) as refused:  # and may not announce a version
            p.send_sync(topics.versions, Metric(component="raas", name="m", value=1.0), key="p")
        assert "TopicAuthorizationFailed" in f"{type(refused.value.__cause__).__name__} {refused.value}"
    with Producer(bootstrap, client_id="test-raas-w") as p:
        with pytest.raises(Exception) as refused:
            p.send_sync(topics.weights("p"), Metric(component="raas", name="m", value=1.0))
        assert "TopicAuthorizationFailed" in f"{type(refused.value.__cause__).__name__} {refused.value}"

    as_user("trainer")
    with Producer(bootstrap, client_id="test-trainer") as p:
        p.send_sync(topics.weights("p"), Metric(component="trainer", name="m", value=1.0))  # its weights
        p.send_sync(topics.versions, Metric(component="trainer", name="m", value=1.0), key="p")
        with pytest.raises(Exception) as refused:  # not the rollout side's topics
            p.send_sync(topics.trajectories, Metric(component="trainer", name="m", value=1.0))
        assert "TopicAuthorizationFailed" in f"{type(refused.value.__cause__).__name__} {refused.value}"
    with pytest.raises(KafkaError):  # nor another role's consumer group
        c = Consumer(bootstrap, topics=[topics.tasks("p")], group_id=topics.rollout_group("p"), client_id="t")
        try:
            for _ in range(20):
                c.poll(timeout_ms=500)
        finally:
            c.close()


# -- astraflow acl / broker start --secure -----------------------------------------------------

def test_the_admin_creates_and_reads_every_topic_but_writes_only_metrics_control_and_dlq():
    topics = JobTopics(job="adm", policies=("a", "b"))
    entries = [e for e in plan(topics, {"admin": "af-admin"}) if e.resource == "TOPIC"]
    prefixed = {e.operation for e in entries if e.pattern == "PREFIXED" and e.name == topics.prefix}
    assert prefixed == {"CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ"}
    writes = {e.name for e in entries if e.operation in ("WRITE", "ALL", "DELETE", "ALTER", "ALTER_CONFIGS")}
    assert writes == {topics.metrics, topics.control, topics.dlq}
    assert not any(e.operation == "ALL" for e in plan(topics, {"admin": "af-admin"}))


def test_acl_plan_follows_the_job_topic_registry(capsys):
    from astraflow.cli import main
    assert main(["acl", "plan", "--job", "planjob", "--policy", "a", "--policy", "b",
                 "--principal", "raas=node-user"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    topics = JobTopics(job="planjob", policies=("a", "b"))
    names = {s.name for s in topics.specs()}
    for principal, op, resource, pattern, name in rows:
        if resource == "TOPIC" and pattern == "LITERAL":
            assert name in names, name  # every topic named is one the registry creates
    raas = {(op, name) for principal, op, resource, _, name in rows if principal == "User:node-user"}
    assert {("READ", topics.tasks("a")), ("READ", topics.tasks("b")), ("WRITE", topics.trajectories),
            ("READ", topics.rollout_group("a"))} <= raas
    assert not {n for op, n in raas if op in ("WRITE", "ALL") and (n == topics.versions or ".weights." in n
                                                                  or ".batches." in n or ".tasks." in n)}
    trainer = {(op, name) for principal, op, _, _, name in rows if principal == "User:af-trainer"}
    assert {("WRITE", topics.weights("a")), ("WRITE", topics.versions), ("READ", topics.batches("b"))} <= trainer
    assert not {n for op, n in trainer if op == "WRITE" and (n == topics.trajectories or ".tasks." in n)}


@slow
def test_broker_start_secure_prints_a_working_super_user_setting(tmp_path, monkeypatch):
    import re
    import subprocess
    import sys
    state = ["--state-dir", str(tmp_path / "state")]

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "astraflow", "broker", *args, *state], capture_output=True,
                              text=True, timeout=300)

    started = cli("start", "--secure", "--port", "0", "--heap", "384m")
    assert started.returncode == 0, started.stderr
    try:
        bootstrap = re.search(r"bootstrap=(\S+)", started.stdout).group(1)
        exports = dict(kv.split("=", 1) for kv in re.search(r"export (.*)", started.stdout).group(1).split())
        password = Path(exports["ASTRAFLOW_KAFKA_PASSWORD_FILE"]).read_text().strip()
        assert password not in started.stdout + started.stderr  # its file is named, the password never printed
        sec = security.from_env(exports)
        admin = security.admin(bootstrap_servers=bootstrap, security=sec)
        admin.list_topics()
        admin.close()
        with pytest.raises(security.KafkaAuthError, match="wants TLS"):
            security.admin(bootstrap_servers=bootstrap, security=security.ClientSecurity())
        assert cli("status").returncode == 0
        plain = cli("start", "--port", "0")  # already running: says so
        assert "already running" in plain.stdout
    finally:
        stopped = cli("stop")
    assert stopped.returncode == 0
    again = cli("start", "--port", "0")  # the same data dir without --secure: refused, not half-secured
    assert again.returncode != 0 and "--secure" in again.stderr


@slow
def test_acl_apply_users_from_the_config_then_each_role_logs_in_as_its_own(secure_broker, tmp_path, monkeypatch,
                                                                          capsys):
    from astraflow.cli import main
    bootstrap, setup = secure_broker.bootstrap_servers, secure_broker.secure
    job = "c" + uuid.uuid4().hex[:8]
    for role in ("raas", "trainer", "dataflow", "admin"):
        (tmp_path / f"{role}.pw").write_text(uuid.uuid4().hex + "\n")
    principals = "".join(f"      {r}: {{username: {job}-{r}, password_file: {r}.pw}}\n"
                         for r in ("raas", "trainer", "dataflow", "admin"))
    path = tmp_path / "job.yaml"
    path.write_text(f"job: {job}\nkafka:\n  bootstrap_servers: {bootstrap}\n  security:\n    protocol: SASL_SSL\n"
                    f"    sasl_mechanism: SCRAM-SHA-512\n    ca_file: {setup.ca_file}\n    principals:\n{principals}")
    for k, v in (("SECURITY_PROTOCOL", "SASL_SSL"), ("SASL_MECHANISM", "SCRAM-SHA-512"), ("USERNAME", "admin"),
                 ("PASSWORD_FILE", str(setup.password_file)), ("CA_FILE", str(setup.ca_file))):
        monkeypatch.setenv(f"ASTRAFLOW_KAFKA_{k}", v)  # the operator: the super user, from the environment
    assert main(["acl", "apply", "--config", str(path), "--users"]) == 0
    assert "ACLs in force for 4 principals" in capsys.readouterr().out
    for k in ("USERNAME", "PASSWORD_FILE"):
        monkeypatch.delenv(f"ASTRAFLOW_KAFKA_{k}")
    cfg = load_config(path)
    from astraflow.topics import job_topics
    topics = job_topics(cfg)
    assert install_security(cfg, "admin").username == f"{job}-admin"
    ensure_topics(bootstrap, topics.specs())  # the job's admin creates its topics
    with Producer(bootstrap, client_id="cfg-admin") as p:  # and writes the launcher's own records
        p.send_sync(topics.control, Metric(component="launcher", name="m", value=1.0))
    for topic in (topics.versions, topics.weights("policy"), topics.batches("policy")):  # never training's
        with Producer(bootstrap, client_id="cfg-admin-refused") as p:
            with pytest.raises(Exception, match="TopicAuthorizationFailed"):
                p.send_sync(topic, Metric(component="launcher", name="m", value=1.0), key="policy")
    assert install_security(cfg, "raas").username == f"{job}-raas"
    with Producer(bootstrap, client_id="cfg-raas") as p:
        p.send_sync(topics.trajectories, Metric(component="raas", name="m", value=1.0))
        with pytest.raises(Exception, match="TopicAuthorizationFailed"):
            p.send_sync(topics.versions, Metric(component="raas", name="m", value=1.0), key="policy")
    install_security(cfg, "trainer")
    with Producer(bootstrap, client_id="cfg-trainer") as p:
        p.send_sync(topics.weights("policy"), Metric(component="trainer", name="m", value=1.0))


def test_a_secured_job_without_a_cluster_is_refused_before_anything_starts(tmp_path, monkeypatch):
    from astraflow.launcher import run_job
    monkeypatch.setenv("AF_TEST_PW", "x")
    path = tmp_path / "job.yaml"
    path.write_text(f"job: sec\nrun_dir: {tmp_path / 'runs'}\nkafka:\n  security:\n    protocol: SASL_SSL\n    sasl_mechanism: PLAIN\n"
                    "    username: u\n    password_env: AF_TEST_PW\n")
    with pytest.raises(ConfigError, match=r"job.yaml: kafka.security: .*existing cluster"):
        run_job(load_config(path), progress=False)
    assert not (tmp_path / "runs").exists()
