"""A regional cluster with SASL and TLS (``regions.<r>.kafka_security`` in the topology): the
generated ``mm2.properties`` carries the client settings without the password (a 0600 file beside
it holds the login, read by Kafka's FileConfigProvider); invalid settings name the key and the
file; and `astraflow mirror` from a plain home cluster into a SASL_SSL one (the secured embedded
broker fixture: SCRAM-SHA-512, a CA of its own, ACLs on) really copies the weights."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from astraflow.config import load_config
from astraflow.topics import JobTopics, ensure_topics, security
from astraflow.topology.launch import load_plan, regional_mirror_plan
from astraflow.topology.mirror_run import run_mirror
from astraflow.topology.schema import TopologyError
from astraflow.weights import WeightPublisher
from astraflow.weights.announcements import read_latest_announcement

from .test_existing_regional_clusters import EXAMPLE, JOB, _history, _publish, _stop, _topology, _trainer_done

PASSWORD = "s3cr3t-" + uuid.uuid4().hex[:6]


def _secured_topology(tmp_path: Path, home: str, region: str, **sec) -> Path:
    return _topology(tmp_path, home, region, kafka_security=sec)


def _sasl_ssl(tmp_path: Path, ca: Path | None = None) -> dict:
    (tmp_path / "eu.password").write_text(PASSWORD + "\n")
    if ca is None:
        ca = tmp_path / "ca.pem"
        ca.write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    return {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "username": "mirror",
            "password_file": "eu.password", "ca_file": str(ca)}


def test_a_sasl_ssl_regions_mirror_config_carries_its_settings_and_not_its_password(tmp_path):
    cfg = load_config(str(JOB), {})
    path = _secured_topology(tmp_path, "10.0.0.1:9092", "10.1.0.1:9092", **_sasl_ssl(tmp_path))
    plan = load_plan(path, cfg)
    mm2 = regional_mirror_plan(plan, cfg, "eu-west", "10.0.0.1:9092")
    out = tmp_path / "mm2"
    out.mkdir()
    props_path = mm2.write(out / "mm2.properties", rest_port=1)
    text = props_path.read_text()
    props = dict(line.split(" = ", 1) for line in text.splitlines()[1:])
    tgt = "region_eu_west"
    assert props[f"{tgt}.security.protocol"] == "SASL_SSL"
    assert props[f"{tgt}.sasl.mechanism"] == "SCRAM-SHA-512"
    assert props[f"{tgt}.ssl.truststore.type"] == "PEM"
    assert props[f"{tgt}.ssl.truststore.location"] == str(tmp_path / "ca.pem")
    secrets = out / "mm2-secrets.properties"
    assert props[f"{tgt}.sasl.jaas.config"] == f"${{file:{secrets}:{tgt}.sasl.jaas.config}}"
    assert props["config.providers"] == "file"
    assert props["config.providers.file.class"].endswith("FileConfigProvider")
    assert "home.security.protocol" not in props  # home: the job's kafka.security, PLAINTEXT here
    assert PASSWORD not in text
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert (f'{tgt}.sasl.jaas.config = org.apache.kafka.common.security.scram.ScramLoginModule required '
            f'username="mirror" password="{PASSWORD}";') in secrets.read_text()


def test_a_password_from_a_variable_is_named_in_the_config_and_written_nowhere(tmp_path, monkeypatch):
    monkeypatch.setenv("EU_MIRROR_PW", PASSWORD)
    cfg = load_config(str(JOB), {})
    sec = {**_sasl_ssl(tmp_path), "password_file": None, "password_env": "EU_MIRROR_PW"}
    mm2 = regional_mirror_plan(load_plan(_secured_topology(tmp_path, "10.0.0.1:9092", "10.1.0.1:9092", **sec), cfg),
                               cfg, "eu-west", "10.0.0.1:9092")
    out = tmp_path / "mm2"
    out.mkdir()
    text = mm2.write(out / "mm2.properties", rest_port=1).read_text()
    props = dict(line.split(" = ", 1) for line in text.splitlines()[1:])
    tgt = "region_eu_west"
    assert props[f"{tgt}.sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                                'username="mirror" password="${env:EU_MIRROR_PW}";')
    assert props["config.providers"] == "env"
    assert props["config.providers.env.class"].endswith("EnvVarConfigProvider")
    assert PASSWORD not in text and not (out / "mm2-secrets.properties").exists()
    # the process's own clients still log in with the password itself
    assert mm2.securities()[tgt].password == PASSWORD


def test_the_mirror_principals_acls_cover_what_it_writes_and_nothing_else_of_the_job():
    from astraflow.topics.acls import mirror_plan
    t = JobTopics(job="mj", policies=("a", "b"))
    rules = mirror_plan(t, "m-eu", source_alias="home", claim_group="astraflow.mirror.mj")
    assert {e.principal for e in rules} == {"User:m-eu"}
    writes = {e.name for e in rules if e.resource == "TOPIC" and e.operation in ("WRITE", "ALL")}
    assert writes == {t.versions, t.weights("a"), t.weights("b"), "mm2-configs.home.internal",
                      "mm2-offsets.home.internal", "mm2-status.home.internal"}
    assert not {e for e in rules if e.pattern == "PREFIXED" and e.resource == "TOPIC"}
    assert {(e.resource, e.name) for e in rules if e.resource == "GROUP"} == {
        ("GROUP", "home-mm2"), ("GROUP", "astraflow.mirror.mj")}
    assert {(e.name, e.pattern) for e in rules if e.resource == "TRANSACTIONAL_ID"} == {
        ("connect-cluster-home-mm2", "LITERAL"), ("home-mm2-", "PREFIXED")}
    assert not {e for e in rules if e.resource == "CLUSTER"}


def test_acl_plan_for_a_regions_mirror_names_its_user_and_refuses_a_region_without_a_cluster(tmp_path):
    sec = _sasl_ssl(tmp_path)
    path = _secured_topology(tmp_path, "10.0.0.1:9092", "10.1.0.1:9092", **sec)
    run = [sys.executable, "-m", "astraflow", "acl", "plan", "--topology", str(path), "--config", str(JOB)]
    out = subprocess.run(run + ["--region", "eu-west"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "# mirror" in out.stdout and "User:mirror" in out.stdout and ".weights." in out.stdout
    assert "WRITE" in out.stdout and "home-mm2" in out.stdout
    out = subprocess.run(run + ["--region", "us-east"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "eu-west" in out.stderr and "us-east" in out.stderr


def test_tls_without_hostname_checks_and_mutual_tls_reach_the_config(tmp_path):
    cfg = load_config(str(JOB), {})
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text(f"-----BEGIN {name}-----\n")
    path = _secured_topology(tmp_path, "10.0.0.1:9092", "10.1.0.1:9092", protocol="SSL", ca_file="ca.pem",
                             cert_file="client.pem", key_file="client.key", check_hostname=False)
    mm2 = regional_mirror_plan(load_plan(path, cfg), cfg, "eu-west", "10.0.0.1:9092")
    mm2.write(tmp_path / "mm2.properties", rest_port=1)
    props = mm2.properties(1, tmp_path)
    tgt = "region_eu_west"
    assert props[f"{tgt}.security.protocol"] == "SSL" and f"{tgt}.sasl.mechanism" not in props
    assert props[f"{tgt}.ssl.endpoint.identification.algorithm"] == ""
    keystore = Path(props[f"{tgt}.ssl.keystore.location"])
    assert props[f"{tgt}.ssl.keystore.type"] == "PEM" and stat.S_IMODE(keystore.stat().st_mode) == 0o600
    assert "client.key" in keystore.read_text() and "client.pem" in keystore.read_text()
    assert "config.providers" not in props  # no secret to read


@pytest.mark.parametrize("sec, key, problem", [
    ({"protocol": "SASL_SSL", "username": "m", "password_env": "X"}, "sasl_mechanism", "SASL_SSL needs one of"),
    ({"protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "username": "m"}, "password_file", "exactly one of"),
    ({"protocol": "SSL", "username": "m"}, "username", "has no SASL login"),
    ({"protocol": "PLAINTEXT", "ca_file": "ca.pem"}, "ca_file", "has no TLS"),
    ({"protocol": "SSL", "cert_file": "c.pem"}, "key_file", "both cert_file and key_file"),
    ({"protocol": "TLS"}, "protocol", "PLAINTEXT"),
    ({"protocol": "SSL", "truststore": "x"}, "truststore", "unknown"),
])
def test_invalid_settings_name_the_key_and_the_file_at_load(tmp_path, sec, key, problem):
    path = _secured_topology(tmp_path, "10.0.0.1:9092", "10.1.0.1:9092", **sec)
    with pytest.raises(TopologyError) as e:
        load_plan(path, load_config(str(JOB), {}))
    want = "regions.eu-west.kafka_security" + (f".{key}" if key else "")
    assert e.value.file == str(path) and e.value.key == want, str(e.value)
    assert problem.lower() in str(e.value).lower()


def test_unreadable_secrets_and_misplaced_settings_name_the_key_and_the_file(tmp_path, monkeypatch):
    cfg = load_config(str(JOB), {})
    sec = _sasl_ssl(tmp_path)
    path = _secured_topology(tmp_path, "10.0.0.1:9092", "10.1.0.1:9092", **{**sec, "password_file": "nope"})
    with pytest.raises(TopologyError) as e:
        run_mirror(path, cfg, "eu-west", bootstrap=None, run_dir=tmp_path)
    assert (e.value.file, e.value.key) == (str(path), "regions.eu-west.kafka_security.password_file")
    assert "nope" in str(e.value)
    monkeypatch.delenv("EU_MIRROR_PASSWORD", raising=False)
    path = _secured_topology(tmp_path, "10.0.0.1:9092", "10.1.0.1:9092",
                             **{**sec, "password_file": None, "password_env": "EU_MIRROR_PASSWORD"})
    with pytest.raises(TopologyError) as e:
        run_mirror(path, cfg, "eu-west", bootstrap=None, run_dir=tmp_path)
    assert e.value.key == "regions.eu-west.kafka_security.password_env" and "EU_MIRROR_PASSWORD" in str(e.value)
    path = _secured_topology(tmp_path, "10.0.0.1:9092", "10.1.0.1:9092", **{**sec, "ca_file": "missing-ca.pem"})
    with pytest.raises(TopologyError) as e:
        run_mirror(path, cfg, "eu-west", bootstrap=None, run_dir=tmp_path)
    assert e.value.key == "regions.eu-west.kafka_security.ca_file" and "missing-ca.pem" in str(e.value)
    path = _secured_topology(tmp_path, "10.0.0.1:9092", "embedded", protocol="SSL")
    with pytest.raises(TopologyError) as e:
        load_plan(path, cfg)
    assert e.value.key == "regions.eu-west.kafka_security" and "'embedded'" in str(e.value)
    data = yaml.safe_load(EXAMPLE.read_text())
    data["regions"]["us-east"]["kafka_security"] = {"protocol": "SSL"}
    home = tmp_path / "home.yaml"
    home.write_text(yaml.safe_dump(data))
    with pytest.raises(TopologyError) as e:
        load_plan(home, cfg)
    assert e.value.key == "regions.us-east.kafka_security" and "kafka.security" in str(e.value)


@pytest.mark.slow
def test_the_mirror_command_copies_weights_from_a_plain_cluster_into_a_sasl_ssl_one(tmp_path, bootstrap,
                                                                                    secure_broker):
    """`astraflow mirror` for a region whose cluster is SASL_SSL (SCRAM-SHA-512, its own CA): the
    claim, the mirrored topics and MirrorMaker 2 all authenticate there; the weights published at
    the plain home cluster arrive; mm2.properties holds no password; trainer.done ends it with 0."""
    setup = secure_broker.secure
    job = "ms" + uuid.uuid4().hex[:8]
    path = _secured_topology(tmp_path, bootstrap, secure_broker.bootstrap_servers, protocol="SASL_SSL",
                             sasl_mechanism="SCRAM-SHA-512", username="admin", password_file=str(setup.password_file),
                             ca_file=str(setup.ca_file))
    topics = JobTopics(job=job, policies=("policy",), task_partitions=2, trajectory_partitions=1)
    ensure_topics(bootstrap, topics.specs())
    history = _history(4)
    run_dir = tmp_path / "run"
    log = open(tmp_path / "mirror.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "astraflow", "mirror", "--topology", str(path), "--region",
                             "eu-west", "--config", str(JOB), "--set", f"job={job}", "--run-dir", str(run_dir)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    pub = WeightPublisher(bootstrap, topics, "policy", snapshot_every=2, chunk_size=64 * 1024)
    region = setup.client_security()
    try:
        _publish(pub, history, range(4))
        deadline = time.monotonic() + 300
        there = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "mirror.log").read_text()
            try:
                there = read_latest_announcement(secure_broker.bootstrap_servers, topics.versions, "policy",
                                                 timeout=10, security_setting=region)
            except Exception:  # noqa: BLE001 - the topic may not exist there yet
                there = None
            if there is not None and there.version == 3:
                break
            time.sleep(2)
        assert there is not None and there.version == 3, (tmp_path / "mirror.log").read_text()
        reader = security.consumer(bootstrap_servers=secure_broker.bootstrap_servers, group_id=None,
                                   enable_auto_commit=False, security=region, client_id="ms-count")
        try:
            from kafka import TopicPartition
            tp = TopicPartition(topics.weights("policy"), 0)
            assert reader.end_offsets([tp])[tp] > 0  # the chunks crossed too
        finally:
            reader.close()
        mm2 = (run_dir / "regions" / "eu-west" / "mirror" / "mm2.properties").read_text()
        assert "SASL_SSL" in mm2 and setup.super_password not in mm2
        _trainer_done(bootstrap, topics)
        assert proc.wait(timeout=120) == 0, (tmp_path / "mirror.log").read_text()
    finally:
        pub.close()
        _stop(proc)
        log.close()
    assert "mirror eu-west: done" in (tmp_path / "mirror.log").read_text()


def test_the_regions_raas_nodes_get_its_security_for_their_weights_and_no_one_else(tmp_path):
    from astraflow.topology.launch import node_command_for, weights_security
    from astraflow.topology.plan import own_clusters
    cfg = load_config(str(JOB), {})
    path = _secured_topology(tmp_path, "10.0.0.1:9092", "10.1.0.1:9092", **_sasl_ssl(tmp_path))
    plan = load_plan(path, cfg)
    own = {r: c.name for r, c in own_clusters(plan).items()}
    command_for = node_command_for(cfg, "10.0.0.1:9092", tmp_path, [], region_weights=own,
                                   region_security=weights_security(plan))
    for node in plan.nodes:
        cmd = command_for(node)
        sets = [a for a in cmd if a.startswith("rollout.weights_security.")]
        if node.region == "eu-west" and node.role == "raas":
            assert sorted(sets) == sorted([
                "rollout.weights_security.protocol=SASL_SSL", "rollout.weights_security.sasl_mechanism=SCRAM-SHA-512",
                "rollout.weights_security.username=mirror",
                f"rollout.weights_security.password_file={(tmp_path / 'eu.password').resolve()}",
                f"rollout.weights_security.ca_file={(tmp_path / 'ca.pem').resolve()}"])
            assert PASSWORD not in " ".join(cmd)
            # what the node loads: the job config with those overrides
            node_cfg = load_config(str(JOB), {"rollout.weights_bootstrap_servers": "10.1.0.1:9092",
                                              **dict(s.split("=", 1) for s in sets)})
            sec = node_cfg.rollout.weights_security.client(node_cfg.source, "rollout.weights_security")
            assert (sec.protocol, sec.mechanism, sec.username, sec.password) == ("SASL_SSL", "SCRAM-SHA-512",
                                                                                  "mirror", PASSWORD)
        else:
            assert sets == []


def test_weights_security_without_a_weights_cluster_or_with_a_bad_shape_names_the_key(tmp_path):
    from astraflow.config import ConfigError
    with pytest.raises(ConfigError) as e:
        load_config(str(JOB), {"rollout.weights_security.protocol": "SSL"})
    assert "weights_security" in e.value.key + str(e.value) and "weights_bootstrap_servers" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(str(JOB), {"rollout.weights_bootstrap_servers": "10.1.0.1:9092",
                               "rollout.weights_security.protocol": "SASL_SSL"})
    assert "weights_security.sasl_mechanism" in str(e.value)


@pytest.mark.slow
def test_a_subscriber_reads_a_sasl_ssl_clusters_weights_with_its_own_setting(tmp_path, secure_broker):
    """The region's RaaS node's weight path: a WeightSubscriber given the region's setting
    (SCRAM over TLS, the fixture's CA) reads a version from the secured cluster while the process's
    own setting stays PLAINTEXT (its other clients talk to a plain home)."""
    from astraflow.weights import WeightSubscriber
    from astraflow.weights.codec import weights_digest
    sec = secure_broker.secure.client_security()
    topics = JobTopics(job="wsec" + uuid.uuid4().hex[:6], policies=("policy",), task_partitions=1,
                       trajectory_partitions=1)
    history = _history(2)
    security.install(sec)
    try:
        ensure_topics(secure_broker.bootstrap_servers, topics.specs())
        pub = WeightPublisher(secure_broker.bootstrap_servers, topics, "policy", snapshot_every=2,
                              chunk_size=64 * 1024)
        try:
            _publish(pub, history, range(2))
        finally:
            pub.close()
    finally:
        security.uninstall()
    assert security.current().protocol == "PLAINTEXT"
    sub = WeightSubscriber(secure_broker.bootstrap_servers, topics, "policy", node_id="eu-sec",
                           security_setting=sec).start()
    try:
        assert sub.wait_for(1, timeout=120), sub.faults
        assert sub.digest() == weights_digest(history[1])
    finally:
        sub.close()


@pytest.mark.slow
@pytest.mark.parametrize("login", ["sasl-password-env", "mutual-tls"])
def test_the_mirror_runs_as_a_least_privilege_principal(tmp_path, bootstrap, secure_broker, login):
    """The region's mirror logs in as its own principal, granted only `acls.mirror_plan` on the
    region's cluster (the super user creates it and its ACLs; then the test process forgets that
    login): `astraflow mirror` claims, creates the mirrored topics and runs MirrorMaker 2 under it,
    and that principal is refused a topic of the job it does not mirror. Two logins: SCRAM with the
    password read from an environment variable and written nowhere (mm2.properties names the
    variable; no secrets file), and mutual TLS on the broker's certificate listener (the
    certificate's CN is the principal; no password at all)."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    from astraflow.topics.acls import apply, mirror_plan
    from astraflow.topics.secured import add_users
    from astraflow.topology.job_mirror import claim_group

    setup = secure_broker.secure
    job = "mp" + uuid.uuid4().hex[:8]
    user, password = f"mirror-{job}", "pw-" + uuid.uuid4().hex
    topics = JobTopics(job=job, policies=("policy",), task_partitions=2, trajectory_partitions=1)
    security.install(setup.client_security())
    try:
        if login == "sasl-password-env":
            add_users(secure_broker.bootstrap_servers, {user: password})
        rules = mirror_plan(topics, user, source_alias="home", claim_group=claim_group(job))
        assert apply(secure_broker.bootstrap_servers, rules) == len(rules)
    finally:
        security.uninstall()
    if login == "sasl-password-env":
        region = secure_broker.bootstrap_servers
        mine = security.ClientSecurity(protocol="SASL_SSL", mechanism="SCRAM-SHA-512", username=user,
                                       password=password, ca_file=str(setup.ca_file))
        path = _secured_topology(tmp_path, bootstrap, region, protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                                 username=user, password_env="EU_MIRROR_PW", ca_file=str(setup.ca_file))
    else:
        region = secure_broker.mtls_bootstrap_servers
        mine = setup.mtls_client_security(user)
        path = _secured_topology(tmp_path, bootstrap, region, protocol="SSL", ca_file=str(setup.ca_file),
                                 cert_file=mine.cert_file, key_file=mine.key_file)
    ensure_topics(bootstrap, topics.specs())
    history = _history(3)
    run_dir = tmp_path / "run"
    log_path = tmp_path / "mirror.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "astraflow", "mirror", "--topology", str(path), "--region",
                             "eu-west", "--config", str(JOB), "--set", f"job={job}", "--run-dir", str(run_dir)],
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "EU_MIRROR_PW": password})
    pub = WeightPublisher(bootstrap, topics, "policy", snapshot_every=2, chunk_size=64 * 1024)
    try:
        _publish(pub, history, range(3))
        deadline, there = time.monotonic() + 300, None
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()
            try:
                there = read_latest_announcement(region, topics.versions, "policy", timeout=10, security_setting=mine)
            except Exception:  # noqa: BLE001 - the topic may not exist there yet
                there = None
            if there is not None and there.version == 2:
                break
            time.sleep(2)
        assert there is not None and there.version == 2, log_path.read_text()
        mirror_dir = run_dir / "regions" / "eu-west" / "mirror"
        mm2 = (mirror_dir / "mm2.properties").read_text()
        assert not (mirror_dir / "mm2-secrets.properties").exists()
        assert not [p for p in run_dir.rglob("*") if p.is_file() and password in p.read_text(errors="replace")]
        if login == "sasl-password-env":
            assert "${env:EU_MIRROR_PW}" in mm2
        else:
            assert "region_eu_west.security.protocol = SSL" in mm2 and "sasl" not in mm2
        # the mirror principal may not write what it does not mirror
        kp = KafkaProducer(bootstrap_servers=region, max_block_ms=15_000, **mine.kwargs())
        try:
            with pytest.raises(KafkaError) as refused:
                kp.send(topics.tasks("policy"), b"forged").get(timeout=15)
            assert "Authorization" in type(refused.value).__name__ or "authoriz" in str(refused.value).lower()
        finally:
            kp.close(timeout=5)
        _trainer_done(bootstrap, topics)
        assert proc.wait(timeout=120) == 0, log_path.read_text()
    finally:
        pub.close()
        _stop(proc)
        log.close()
    assert "mirror eu-west: done" in log_path.read_text()
