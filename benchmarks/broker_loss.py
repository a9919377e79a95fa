"""How long losing one broker of three stalls rollout, per role the broker held.

A 3-node :class:`~astraflow.topics.EmbeddedCluster`; a scheduler writes tasks to
``tasks.policy`` at a steady rate; two RaaS-node loops (threads) do what
:class:`~astraflow.actors.rollout.RolloutActor` does per step with long-lived clients: poll
tasks as members of one group (the node's session timeout and assignor), "roll out" (a
short sleep), then write a result per task and commit the task offsets in one transaction
(:meth:`Producer.send_offsets`). Each repetition picks fresh names so that the group's
coordinator, the two nodes' transaction coordinator and a third broker that leads only
partitions (of the tasks topic among others) are three different brokers, then SIGKILLs
the one of the role measured:

- ``leader``: a broker leading partitions of the tasks topic, no coordinator;
- ``group``: the group coordinator (the nodes' ``TxnOffsetCommit`` goes there);
- ``transaction``: the nodes' transaction coordinator (``AddOffsetsToTxn``, ``EndTxn``).

The stall of a node is the longest gap between two of its committed transactions across
the kill (from before it until every node committed three transactions begun after it);
``stall_s`` is the worst node's, ``none_committing_s`` how long no node committed at all.
A node loop whose step fails (its producer gave up, :class:`ProduceError`; any error
but a lost membership) rebuilds its clients, as the actor's supervisor would restart the
actor: ``restarts`` counts those; ``fenced`` the
transactions dropped because the node lost its group membership. The killed broker is
restarted and caught up between repetitions. ``--stock`` measures kafka-python's own
transactional request handling (without :mod:`astraflow.topics.txn_recovery`).

Prints one table and writes ``benchmarks/results/broker_loss.json`` (``broker_loss_stock.json``
with ``--stock``).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.stats import fmt_spread, spread
from astraflow.chaos.faults import coordinator_partition
from astraflow.topics import (Consumer, EmbeddedCluster, JobTopics, Producer, Prompt,
                              StaleMembershipError, ensure_topics, txn_recovery)
from astraflow.topics import security

RESULTS = Path(__file__).resolve().parent / "results"
ROLES = ("leader", "group", "transaction")
SESSION_TIMEOUT_MS = 10_000  #: the RaaS node's task consumer (actors/rollout.py TASK_SESSION_TIMEOUT_MS)
ROLLOUT_S = 0.05  #: the "rollout" of one poll's tasks
TASK_RATE = 40.0  #: tasks per second the scheduler writes
RECOVERED_AFTER = 3  #: transactions begun after the kill each node must commit to count as recovered
GIVE_UP_S = 120.0


# -- where Kafka puts a coordinator (chaos.faults.coordinator_partition) -----------------------

def _leaders(admin: security.KafkaAdminClient, topic: str) -> dict[int, int]:
    return {p["partition_index"]: p["leader_id"] for p in admin.describe_topics([topic])[0]["partitions"]}


def _name_led_by(leaders: dict[int, int], broker: int, prefix: str) -> str | None:
    """A name ``prefix-<n>`` whose coordinator partition ``broker`` leads, None if it leads none."""
    for n in range(10_000):
        if leaders[coordinator_partition(f"{prefix}-{n}", len(leaders))] == broker:
            return f"{prefix}-{n}"
    return None


@dataclass(frozen=True)
class Layout:
    """Who holds which role in one repetition."""

    group: str
    transactional_ids: tuple[str, str]
    group_coordinator: int
    transaction_coordinator: int
    leader: int  #: neither coordinator
    task_partitions_led: dict[int, int]  #: broker -> how many tasks partitions it leads

    def victim(self, role: str) -> int:
        return {"leader": self.leader, "group": self.group_coordinator,
                "transaction": self.transaction_coordinator}[role]


def plan(bootstrap: str, topics: JobTopics) -> Layout:
    """Names whose group and transaction coordinators are two different brokers, the third
    leading tasks partitions only."""
    admin = security.admin(bootstrap_servers=bootstrap, client_id="broker-loss")
    deadline = time.monotonic() + 60
    try:
        offsets, txns = _leaders(admin, "__consumer_offsets"), _leaders(admin, "__transaction_state")
        while True:  # a topic just created may not have its leaders yet
            tasks = _leaders(admin, topics.tasks("policy"))
            if len(tasks) == topics.task_partitions and min(tasks.values()) >= 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topics.tasks('policy')} has no leader for every partition: {tasks}")
            time.sleep(0.5)
    finally:
        admin.close()
    led = {b: sum(1 for leader in tasks.values() if leader == b) for b in sorted(set(offsets.values()) | set(tasks.values()))}
    for g in sorted(set(offsets.values())):
        for t in sorted(set(txns.values()) - {g}):
            rest = [b for b in led if b not in (g, t) and led[b] > 0]
            group, tid = _name_led_by(offsets, g, f"{topics.job}-raas"), _name_led_by(txns, t, f"{topics.job}-tx-a")
            tid_b = _name_led_by(txns, t, f"{topics.job}-tx-b")
            if rest and group and tid and tid_b:
                return Layout(group, (tid, tid_b), g, t, rest[0], led)
    raise RuntimeError(f"no layout with three distinct roles: __consumer_offsets leaders {sorted(set(offsets.values()))}, "
                       f"__transaction_state leaders {sorted(set(txns.values()))}, tasks leaders {led}; "
                       f"restart the cluster so leadership is balanced")


# -- the scheduler and the nodes -------------------------------------------------------------

class Scheduler(threading.Thread):
    def __init__(self, bootstrap: str, topic: str, stop: threading.Event) -> None:
        super().__init__(daemon=True, name="scheduler")
        self.bootstrap, self.topic, self.stop = bootstrap, topic, stop

    def run(self) -> None:
        producer = Producer(self.bootstrap, client_id="scheduler")
        try:
            i = 0
            while not self.stop.is_set():
                producer.send(self.topic, Prompt(f"t{i}", "x", "1"), key=f"t{i}")
                i += 1
                time.sleep(1 / TASK_RATE)
        finally:
            producer.close(timeout=0)


@dataclass
class NodeLog:
    commits: list[tuple[float, float]] = field(default_factory=list)  #: (began, committed) monotonic
    restarts: int = 0
    fenced: int = 0
    errors: list[str] = field(default_factory=list)


class Node(threading.Thread):
    """A RaaS node's step loop with long-lived clients; rebuilt only when its producer gives up."""

    def __init__(self, bootstrap: str, topics: JobTopics, group: str, tid: str, name: str,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True, name=name)
        self.bootstrap, self.topics, self.group, self.tid, self.stop = bootstrap, topics, group, tid, stop
        self.log = NodeLog()

    def _clients(self) -> tuple[Producer, Consumer]:
        return (Producer(self.bootstrap, client_id=self.name, transactional_id=self.tid),
                Consumer(self.bootstrap, topics=[self.topics.tasks("policy")], group_id=self.group,
                         client_id=self.name, session_timeout_ms=SESSION_TIMEOUT_MS,
                         heartbeat_interval_ms=SESSION_TIMEOUT_MS // 5,
                         sticky=True, expect=(Prompt,)))

    def run(self) -> None:
        producer, consumer = self._clients()
        try:
            while not self.stop.is_set():
                got = consumer.poll(200)
                if not got:
                    continue
                began = time.monotonic()
                time.sleep(ROLLOUT_S)
                try:
                    with producer.transaction():
                        for d in got:
                            producer.send(self.topics.trajectories, Prompt("out-" + d.message.prompt_id, "y", "1"),
                                          key=d.key)
                        producer.send_offsets(consumer)
                except StaleMembershipError:
                    self.log.fenced += 1
                    continue
                except Exception as e:  # noqa: BLE001 - what fails a RolloutActor step: its supervisor restarts it
                    self.log.restarts += 1
                    self.log.errors.append(f"{type(e).__name__}: {e}"[:300])
                    producer.close(timeout=0)
                    consumer.close()
                    producer, consumer = self._clients()
                    continue
                self.log.commits.append((began, time.monotonic()))
        finally:
            producer.close(timeout=0)
            consumer.close()


def _stall(commits: list[tuple[float, float]], kill: float, until: float) -> float:
    """The longest gap between consecutive commits that spans part of [kill, until] (a node
    that has not committed since its last commit before ``until`` counts until then)."""
    done = [c for _, c in commits] + [until]
    gaps = [b - a for a, b in zip(done, done[1:]) if b > kill and a < until]
    return max(gaps, default=float("nan"))


def one_kill(cluster: EmbeddedCluster, role: str, rep: int) -> dict:
    """Fresh topics and names, two nodes running, SIGKILL the role's broker, measure, restart it."""
    bootstrap = cluster.bootstrap_servers
    topics = JobTopics(job=f"bl{rep}{role[0]}" + uuid.uuid4().hex[:6], policies=("policy",), task_partitions=8,
                       trajectory_partitions=4)
    ensure_topics(bootstrap, topics.specs())
    layout = plan(bootstrap, topics)
    stop = threading.Event()
    scheduler = Scheduler(bootstrap, topics.tasks("policy"), stop)
    nodes = [Node(bootstrap, topics, layout.group, tid, f"raas-{i}", stop)
             for i, tid in enumerate(layout.transactional_ids)]
    scheduler.start()
    for n in nodes:
        n.start()
    victim = layout.victim(role)
    try:
        deadline = time.monotonic() + GIVE_UP_S
        while min(len(n.log.commits) for n in nodes) < 5:  # both nodes in the group and committing
            if time.monotonic() > deadline:
                raise RuntimeError(f"the nodes never got going: {[asdict(n.log) for n in nodes]}")
            time.sleep(0.2)
        time.sleep(1.0)
        kill = time.monotonic()
        cluster.kill(victim)
        deadline = kill + GIVE_UP_S
        while not all(sum(1 for b, _ in n.log.commits if b > kill) >= RECOVERED_AFTER for n in nodes):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        recovered = time.monotonic()
    finally:
        stop.set()
        for n in nodes:
            n.join(30)
        scheduler.join(10)
    merged = sorted((b, c) for n in nodes for b, c in n.log.commits)
    row = {"role": role, "rep": rep, "victim": victim, "layout": asdict(layout),
           "recovered": all(sum(1 for b, _ in n.log.commits if b > kill) >= RECOVERED_AFTER for n in nodes),
           "stall_s": max(_stall(n.log.commits, kill, recovered) for n in nodes),
           "none_committing_s": _stall(merged, kill, recovered),
           "node_stall_s": [round(_stall(n.log.commits, kill, recovered), 2) for n in nodes],
           "restarts": sum(n.log.restarts for n in nodes), "fenced": sum(n.log.fenced for n in nodes),
           "errors": [e for n in nodes for e in n.log.errors][:4]}
    cluster.restart(victim)
    _settle(bootstrap)
    return row


def _settle(bootstrap: str, timeout_s: float = 180.0) -> None:
    """Until every partition has all three replicas in sync (the restarted broker caught up),
    then give every partition its preferred leader back (the next layout needs each broker
    to lead some ``__consumer_offsets`` and ``__transaction_state`` partitions)."""
    admin = security.admin(bootstrap_servers=bootstrap, client_id="broker-loss")
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            names = admin.list_topics()
            described = admin.describe_topics(names)
            if all(len(p["isr_nodes"]) >= 3 for t in described for p in t["partitions"]):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the restarted broker did not catch up within {timeout_s:.0f}s")
            time.sleep(1.0)
        admin.elect_leaders(0, None, raise_errors=False)  # 0: preferred
        while time.monotonic() < deadline:
            internal = admin.describe_topics(["__consumer_offsets", "__transaction_state"])
            if all(len({p["leader_id"] for p in t["partitions"]}) == 3 for t in internal):
                return
            time.sleep(1.0)
        raise RuntimeError("leadership of the internal topics did not spread over the three brokers again")
    finally:
        admin.close()


def _warm_internal_topics(bootstrap: str) -> None:
    """One transaction with a group's offsets: creates ``__consumer_offsets`` and ``__transaction_state``."""
    topics = JobTopics(job="blwarm" + uuid.uuid4().hex[:6], policies=("policy",))
    ensure_topics(bootstrap, topics.specs())
    tasks = Producer(bootstrap, client_id="warm")
    tasks.send_sync(topics.prompts, Prompt("w", "x", "1"))
    tasks.close()
    p = Producer(bootstrap, client_id="warm", transactional_id=f"{topics.job}-tx")
    c = Consumer(bootstrap, topics=[topics.prompts], group_id=f"{topics.job}-g")
    try:
        for _ in range(60):
            if c.poll(500):
                with p.transaction():
                    p.send(topics.trajectories, Prompt("w", "y", "1"))
                    p.send_offsets(c)
                return
        raise RuntimeError("warm-up record never arrived")
    finally:
        p.close()
        c.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="kills per role (default 3)")
    ap.add_argument("--roles", default=",".join(ROLES), help=f"comma-separated, of {', '.join(ROLES)}")
    ap.add_argument("--stock", action="store_true", help="kafka-python's own transactional request handling")
    args = ap.parse_args(argv)
    roles = [r for r in args.roles.split(",") if r]
    unknown = sorted(set(roles) - set(ROLES))
    if unknown or args.repeats < 1:
        ap.error(f"--roles: unknown {unknown} (known: {', '.join(ROLES)})" if unknown else "--repeats must be >= 1")
    if args.stock:
        txn_recovery.uninstall()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("kafka", "astraflow.topics.socket_reads"):  # a killed broker's connections, expected
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    load = load_now()
    runs: list[dict] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="astraflow-broker-loss-") as tmp, \
            EmbeddedCluster(Path(tmp) / "kafka", nodes=3, heap="384m") as cluster:
        _warm_internal_topics(cluster.bootstrap_servers)
        for rep in range(args.repeats):
            for role in roles:  # interleaved, so load from other work hits every role alike
                row = one_kill(cluster, role, rep)
                runs.append(row)
                print(f"  {role:<12} rep {rep}: broker {row['victim']} killed, stall {row['stall_s']:.1f}s "
                      f"(nodes {row['node_stall_s']}), restarts {row['restarts']}, fenced {row['fenced']}", flush=True)
    rows = []
    for role in roles:
        mine = [r for r in runs if r["role"] == role]
        rows.append({"role": role, "stall_s": spread([r["stall_s"] for r in mine]),
                     "none_committing_s": spread([r["none_committing_s"] for r in mine]),
                     "restarts": sum(r["restarts"] for r in mine), "fenced": sum(r["fenced"] for r in mine),
                     "all_recovered": all(r["recovered"] for r in mine)})
    print(f"\nlosing one broker of three ({'stock kafka-python' if args.stock else 'with txn_recovery'}), "
          f"{args.repeats} kills per role; seconds, median (min–max)")
    print(f"{'role':<12} {'stall (worst node)':>20} {'no node committing':>20} {'restarts':>9} {'fenced':>7}")
    for r in rows:
        print(f"{r['role']:<12} {fmt_spread(r['stall_s'], '.1f'):>20} {fmt_spread(r['none_committing_s'], '.1f'):>20} "
              f"{r['restarts']:>9} {r['fenced']:>7}")
    write_results(RESULTS / ("broker_loss_stock.json" if args.stock else "broker_loss.json"),
                  {"benchmark": "broker_loss", "stock_kafka_python": args.stock, "repeats": args.repeats,
                   "method": {"nodes": 2, "task_rate_per_s": TASK_RATE, "rollout_s": ROLLOUT_S,
                              "session_timeout_ms": SESSION_TIMEOUT_MS, "recovered_after": RECOVERED_AFTER},
                   "rows": rows, "runs": runs, "wall_s": round(time.monotonic() - t0, 1)}, load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
