"""Per-policy principals (``kafka.security.principals.<role>.<policy>``) and the ACLs scoped to them.

A ``trainer.<p>`` or ``raas.<p>`` principal gets only policy ``p``'s resources; a plain
``trainer``/``raas`` keeps every policy's; ``astraflow acl plan --topology`` plans only the
principals a topology's pools run, a plain one only for the policies its pools serve there,
with a warning when that is more than one. Against the real secured broker, ``trainer.a`` of a
two-policy job writes ``weights.a`` and is refused ``weights.b``; ``raas.a`` reads
``tasks.a`` and is refused ``tasks.b``.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from kafka.errors import TopicAuthorizationFailedError

from astraflow.config import install_security, load_config
from astraflow.topics import JobTopics, Producer, ensure_topics, security
from astraflow.topics.acls import apply, plan
from astraflow.topics.consumer import Consumer
from astraflow.topics.messages import Metric
from astraflow.topics.secured import add_users
from astraflow.typed_config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE, TOPOLOGY = ROOT / "examples" / "solver_verifier.yaml", ROOT / "examples" / "topology_solver_verifier.yaml"


@pytest.fixture(autouse=True)
def _no_installed_setting():
    security.uninstall()
    yield
    security.uninstall()


def _grants(entries, user: str) -> set[tuple[str, str, str]]:
    return {(e.operation, e.resource, e.name) for e in entries if e.principal == f"User:{user}"}


def _team_config(tmp_path: Path, principals: str, username: bool = False) -> Path:
    """The shipped solver-verifier job, copied, with a SASL security section."""
    path = tmp_path / "job.yaml"
    shutil.copy(EXAMPLE, path)
    for name in ("trainer.solver", "raas.solver", "trainer", "raas", "dataflow", "admin", "default"):
        (tmp_path / f"{name}.pw").write_text(f"pw-{name}\n")
    body = "".join(f"      {line}\n" for line in principals.strip().splitlines())
    user = "    username: af-all\n    password_file: default.pw\n" if username else ""
    with path.open("a") as f:
        f.write(f"\nkafka:\n  security:\n    protocol: SASL_PLAINTEXT\n    sasl_mechanism: SCRAM-SHA-512\n{user}"
                f"    principals:\n{body}")
    return path


# -- the plan ------------------------------------------------------------------------------

def test_a_per_policy_principal_gets_only_its_own_policys_resources():
    t = JobTopics(job="pp", policies=("a", "b"))
    entries = plan(t, {"trainer.a": "ta", "raas.a": "ra", "trainer": "t-all", "raas": "r-all"})
    ta, ra = _grants(entries, "ta"), _grants(entries, "ra")
    assert {("WRITE", "TOPIC", t.weights("a")), ("READ", "TOPIC", t.batches("a")),
            ("WRITE", "TOPIC", t.versions)} <= ta  # versions: one topic, each announcement signed per policy
    assert not {g for g in ta if t.weights("b") in g or t.batches("b") in g}
    assert {("READ", "TOPIC", t.tasks("a")), ("READ", "GROUP", t.rollout_group("a")),
            ("READ", "TOPIC", t.weights("a")), ("WRITE", "TOPIC", t.trajectories)} <= ra
    assert not {g for g in ra if g[2] in (t.tasks("b"), t.rollout_group("b"), t.weights("b"))}
    assert not {g for g in ra if g[0] in ("WRITE", "ALL") and (g[2] == t.versions or ".weights." in g[2])}
    # its transactions only under its own policy's ids (the ids RaaS nodes take: af.<job>.raas.<p>.<node>)
    tids = {(e.name, e.pattern) for e in entries if e.principal == "User:ra" and e.resource == "TRANSACTIONAL_ID"}
    assert tids == {(f"{t.prefix}raas.a.", "PREFIXED")}
    assert t.rollout_transactional_id("a", "solver-raas-0").startswith(f"{t.prefix}raas.a.")
    assert not t.rollout_transactional_id("b", "raas-0").startswith(f"{t.prefix}raas.a.")
    # a plain role principal keeps every policy's grants, as before
    assert {("WRITE", "TOPIC", t.weights("a")), ("WRITE", "TOPIC", t.weights("b"))} <= _grants(entries, "t-all")
    assert {("READ", "TOPIC", t.tasks("a")), ("READ", "TOPIC", t.tasks("b"))} <= _grants(entries, "r-all")
    assert ("WRITE", "TRANSACTIONAL_ID", f"{t.prefix}raas.") in _grants(entries, "r-all")


def test_a_per_policy_raas_principal_serves_its_own_generate_topic_and_calls_the_others():
    from astraflow.topics import job_topics
    t = job_topics(load_config(EXAMPLE))  # the shipped solver-verifier team
    assert t.replies in {s.name for s in t.specs()}  # a multi-policy job: role calls between the pools
    rv = _grants(plan(t, {"raas.verifier": "rv"}), "rv")
    assert {("READ", "TOPIC", t.generate("verifier")), ("READ", "GROUP", t.generation_group("verifier")),
            ("WRITE", "TOPIC", t.generate("solver")), ("READ", "TOPIC", t.replies),
            ("WRITE", "TOPIC", t.replies)} <= rv
    assert ("WRITE", "TOPIC", t.generate("verifier")) not in rv  # its own pool serves its own role calls
    assert not {g for g in rv if g[2] in (t.generate("solver"), t.generation_group("solver")) and g[0] == "READ"}


@pytest.mark.parametrize("key, says", [("dataflow.a", "serves every policy"), ("robot.a", "unknown role"),
                                       ("raas.c", "no policy 'c'")])
def test_the_plan_refuses_a_principal_it_cannot_scope(key, says):
    with pytest.raises(ValueError, match=says):
        plan(JobTopics(job="pp", policies=("a", "b")), {key: "u"})


# -- kafka.security.principals.<role>.<policy> in the job config ----------------------------------

def test_a_node_serving_a_policy_logs_in_as_its_per_policy_principal_else_as_its_role(tmp_path):
    path = _team_config(tmp_path, "trainer.solver: {username: t-solver, password_file: trainer.solver.pw}\n"
                                  "raas.solver: {username: r-solver, password_file: raas.solver.pw}\n"
                                  "trainer: {username: t-any, password_file: trainer.pw}\n"
                                  "raas: {username: r-any, password_file: raas.pw}\n"
                                  "dataflow: {username: df, password_file: dataflow.pw}\n"
                                  "admin: {username: adm, password_file: admin.pw}")
    cfg = load_config(path)
    got = {(role, p): install_security(cfg.view(p), role) for role in ("trainer", "raas")
           for p in ("solver", "verifier")}
    assert {k: (s.username, s.password) for k, s in got.items()} == {
        ("trainer", "solver"): ("t-solver", "pw-trainer.solver"), ("trainer", "verifier"): ("t-any", "pw-trainer"),
        ("raas", "solver"): ("r-solver", "pw-raas.solver"), ("raas", "verifier"): ("r-any", "pw-raas")}
    assert install_security(cfg, "trainer", "solver").username == "t-solver"  # the explicit policy (astraflow node)
    assert install_security(cfg, "dataflow").username == "df"
    assert security.current().username == "df"


@pytest.mark.parametrize("principals, key, says", [
    ("trainer.nobody: {username: x, password_file: trainer.pw}", "kafka.security.principals.trainer.nobody",
     "no policy 'nobody'"),
    ("robot.solver: {username: x, password_file: trainer.pw}", "kafka.security.principals.robot.solver",
     "unknown role 'robot'"),
    ("dataflow.solver: {username: x, password_file: dataflow.pw}", "kafka.security.principals.dataflow.solver",
     "serves every policy"),
])
def test_a_per_policy_principal_naming_an_unknown_policy_or_role_is_a_config_error(tmp_path, principals, key, says):
    with pytest.raises(ConfigError) as e:
        load_config(_team_config(tmp_path, principals, username=True))
    assert str(tmp_path / "job.yaml") in str(e.value) and key in str(e.value) and says in str(e.value), str(e.value)


def test_without_a_default_user_every_policy_of_a_per_policy_role_needs_its_principal(tmp_path):
    path = _team_config(tmp_path, "trainer.solver: {username: t-solver, password_file: trainer.solver.pw}\n"
                                  "raas: {username: r-any, password_file: raas.pw}\n"
                                  "dataflow: {username: df, password_file: dataflow.pw}\n"
                                  "admin: {username: adm, password_file: admin.pw}")
    with pytest.raises(ConfigError, match=r"job.yaml: kafka.security.principals.trainer.verifier: .*no principal"):
        load_config(path)


# -- astraflow acl plan --topology ------------------------------------------------------------------

def _rows(out: str) -> dict[str, set[tuple[str, str, str]]]:
    blocks, role = {}, None
    for line in out.splitlines():
        if line.startswith("# "):
            role = line[2:]
            blocks[role] = set()
        elif line.strip():
            principal, op, resource, _pattern, name = line.split()
            blocks[role].add((principal, op, name))
    return blocks


def test_acl_plan_topology_plans_one_block_per_principal_the_plan_runs(tmp_path, capsys):
    from astraflow.cli import main
    from astraflow.topics import job_topics
    path = _team_config(tmp_path, "trainer.solver: {username: t-solver, password_file: trainer.solver.pw}\n"
                                  "trainer.verifier: {username: t-verifier, password_file: trainer.pw}\n"
                                  "raas.solver: {username: r-solver, password_file: raas.solver.pw}\n"
                                  "raas: {username: r-any, password_file: raas.pw}\n"
                                  "dataflow: {username: df, password_file: dataflow.pw}\n"
                                  "admin: {username: adm, password_file: admin.pw}")
    assert main(["acl", "plan", "--config", str(path), "--topology", str(TOPOLOGY)]) == 0
    blocks = _rows(capsys.readouterr().out)
    # the topology runs a trainer and a RaaS pool per policy, the dataflow; the launcher is the admin.
    # Both trainers are per policy, so no plain `trainer` block; the verifier's pool logs in as `raas`.
    assert set(blocks) == {"admin", "dataflow", "raas", "raas.solver", "trainer.solver", "trainer.verifier"}
    t = job_topics(load_config(path))
    assert {(p, op) for p, op, n in blocks["trainer.solver"] if n == t.weights("solver")} >= {("User:t-solver", "WRITE")}
    assert not any(n in (t.weights("verifier"), t.batches("verifier")) for _, _, n in blocks["trainer.solver"])
    assert ("User:t-verifier", "WRITE", t.weights("verifier")) in blocks["trainer.verifier"]
    assert not any(n == t.tasks("verifier") for _, _, n in blocks["raas.solver"])
    assert ("User:r-any", "READ", t.tasks("verifier")) in blocks["raas"]
    # the plain `raas` runs only the verifier's pool here: it gets the verifier's rows, not the solver's
    assert not any(n in (t.tasks("solver"), t.weights("solver"), t.generate("solver")) and op == "READ"
                   for _, op, n in blocks["raas"])


def test_acl_plan_topology_warns_when_a_plain_principal_serves_several_policies(tmp_path, capsys):
    from astraflow.cli import main
    from astraflow.topics import job_topics
    path = _team_config(tmp_path, "trainer: {username: t-any, password_file: trainer.pw}\n"
                                  "raas: {username: r-any, password_file: raas.pw}\n"
                                  "dataflow: {username: df, password_file: dataflow.pw}\n"
                                  "admin: {username: adm, password_file: admin.pw}")
    assert main(["acl", "plan", "--config", str(path), "--topology", str(TOPOLOGY)]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 2, err  # raas and trainer, one line each
    for role in ("raas", "trainer"):
        line = next(w for w in warnings if f"principal {role!r}" in w)
        assert "solver, verifier" in line and f"kafka.security.principals.{role}.solver" in line, line
    t = job_topics(load_config(path))
    assert ("User:t-any", "WRITE", t.weights("verifier")) in _rows(out)["trainer"]  # it serves both: both rows
    # per policy, no warning
    path = _team_config(tmp_path, "trainer.solver: {username: t-s, password_file: trainer.solver.pw}\n"
                                  "trainer.verifier: {username: t-v, password_file: trainer.pw}\n"
                                  "raas.solver: {username: r-s, password_file: raas.solver.pw}\n"
                                  "raas.verifier: {username: r-v, password_file: raas.pw}\n"
                                  "dataflow: {username: df, password_file: dataflow.pw}\n"
                                  "admin: {username: adm, password_file: admin.pw}")
    assert main(["acl", "plan", "--config", str(path), "--topology", str(TOPOLOGY)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_plain_principal_scoped_to_the_policies_it_serves_gets_only_theirs():
    topics = JobTopics(job="sc", policies=("a", "b", "c"))
    one = _grants(plan(topics, {"raas": "r"}, {"raas": ("b",)}), "r")
    assert ("READ", "TOPIC", topics.tasks("b")) in one and ("READ", "TOPIC", topics.tasks("a")) not in one
    assert ("WRITE", "TRANSACTIONAL_ID", topics.rollout_transactional_id("b", "")) in one
    assert ("WRITE", "TRANSACTIONAL_ID", f"{topics.prefix}raas.") not in one
    every = _grants(plan(topics, {"raas": "r"}), "r")
    assert {("READ", "TOPIC", topics.tasks(p)) for p in "abc"} <= every
    trainer = _grants(plan(topics, {"trainer": "t"}, {"trainer": ("a", "c")}), "t")
    assert {("WRITE", "TOPIC", topics.weights(p)) for p in "ac"} <= trainer
    assert ("WRITE", "TOPIC", topics.weights("b")) not in trainer



# -- the real secured broker -----------------------------------------------------------------

def _poll_in_group(bootstrap: str, topic: str, group: str) -> list:
    """What a RaaS node does: read ``topic`` in consumer group ``group`` (its first record)."""
    c = Consumer(bootstrap, topics=[topic], group_id=group, client_id="pp-raas")
    try:
        got = []
        for _ in range(60):
            got += c.poll(timeout_ms=500)
            if got:
                return got
        return got
    finally:
        c.close()


@pytest.mark.slow
@pytest.mark.core  # the secured broker in `make test`: one start, shared with tests/topics/test_security.py
def test_per_policy_principals_are_refused_the_other_policys_weights_and_tasks(secure_broker):
    bootstrap, sup = secure_broker.bootstrap_servers, secure_broker.secure.client_security()
    security.install(sup)
    topics = JobTopics(job="q" + uuid.uuid4().hex[:8], policies=("a", "b"), task_partitions=1,
                       trajectory_partitions=1)
    ensure_topics(bootstrap, topics.specs())
    users = {"trainer.a": f"trainer-a-{topics.job}", "raas.a": f"raas-a-{topics.job}"}
    passwords = {u: uuid.uuid4().hex for u in users.values()}
    add_users(bootstrap, passwords)
    entries = plan(topics, users)
    assert apply(bootstrap, entries) == len(entries)
    with Producer(bootstrap, client_id="pp-admin") as p:  # the super user writes a task of each policy
        p.send_sync(topics.tasks("a"), Metric(component="task-a", name="task", value=1.0))
        p.send_sync(topics.tasks("b"), Metric(component="task-b", name="task", value=1.0))

    def as_user(key: str) -> None:
        security.install(security.with_credentials(sup, users[key], passwords[users[key]]))

    def refused(send) -> str:
        with pytest.raises(Exception) as e:
            send()
        return f"{type(e.value.__cause__).__name__} {type(e.value).__name__} {e.value}"

    as_user("trainer.a")
    with Producer(bootstrap, client_id="pp-trainer-a") as p:
        p.send_sync(topics.weights("a"), Metric(component="trainer", name="m", value=1.0))  # its own weights
        p.send_sync(topics.versions, Metric(component="trainer", name="m", value=1.0), key="a")
    with Producer(bootstrap, client_id="pp-trainer-a-b") as p:
        assert "TopicAuthorization" in refused(
            lambda: p.send_sync(topics.weights("b"), Metric(component="trainer", name="m", value=1.0)))

    as_user("raas.a")
    group = topics.rollout_group("a")
    assert [d.message.component for d in _poll_in_group(bootstrap, topics.tasks("a"), group)] == ["task-a"]
    # The other policy's tasks: the broker answers its metadata request for tasks.b (what a consumer
    # asks before it may fetch) with TOPIC_AUTHORIZATION_FAILED; READ would imply DESCRIBE.
    client = security.admin(bootstrap_servers=bootstrap, client_id="pp-raas-describe")
    try:
        described = {t["name"]: t["error_code"] for t in client.describe_topics([topics.tasks("a"), topics.tasks("b")])}
    finally:
        client.close()
    assert described == {topics.tasks("a"): 0, topics.tasks("b"): TopicAuthorizationFailedError.errno}, described


def test_set_reaches_a_per_policy_principal(tmp_path):
    """``--set kafka.security.principals.raas.solver.username=X``: the entry ``raas.solver``
    (itself dotted), not a section ``raas`` holding ``solver``."""
    path = _team_config(tmp_path, "raas.solver: {username: r-solver, password_file: raas.solver.pw}\n"
                                  "raas: {username: r-any, password_file: raas.pw}", username=True)
    cfg = load_config(path, {"kafka.security.principals.raas.solver.username": "r-solver-2",
                             "kafka.security.principals.raas.username": "r-any-2"})
    assert cfg.kafka.security.principals["raas.solver"].username == "r-solver-2"
    assert cfg.kafka.security.principals["raas"].username == "r-any-2"
    assert set(cfg.kafka.security.principals) == {"raas.solver", "raas"}
