"""The autoscaler actor: sizes a policy's RaaS pools from the topics and acts through a backend.

Reads ``control`` (heartbeats: who is up, for device-hours; the trainer's, which it sends
only while waiting for a batch, for the wait still open), ``metrics`` (the trainer's
per-step wait and train time, every node's busy time: its own rollouts and the role calls
it serves for other policies' episodes, the trainer's ``done``) and
``drops.<policy>`` (stale drops), all from their beginning, so a restarted actor rebuilds
the same picture. Every ``interval_s`` it writes the device-hours so far to ``metrics``
(``devices.hours`` per pool, ``devices.total_hours``; with the Slurm backend also Slurm's own
count, ``devices.scheduler_hours`` and ``devices.scheduler_total_hours``) and, when the topology enables
scaling, asks :class:`~.scaling.Scaler` for a decision and carries it out: growing the
cheapest pool per unit of speed that is below its ``max`` (nearest the trainer at equal
cost), retiring the newest node of the dearest pool above its ``min``.
Each decision is a metric too (``autoscaler.*``: wait fraction, demand, lag, pool size,
target and the reason), which is what ``status``, plots and tests read.

Which nodes exist is the backend's record (:mod:`.backends`), not this actor's, so an
in-process restart neither forgets nor duplicates nodes. Nodes of fixed
pools belong to their host's runner and are only counted here.
"""

from __future__ import annotations

import logging
import time

from astraflow.actors.common import close_quietly
from astraflow.actors.supervisor import LoopActor
from astraflow.actors.telemetry import MetricsEmitter
from astraflow.config import JobConfig
from astraflow.topics import (Consumer, DeadLetters, Heartbeat, Metric, Producer, SnapshotRequest, TopicPartition,
                              job_topics)
from astraflow.topics.messages import GroupDrop
from astraflow.topics import security

from .accounting import DeviceHours, starting_heartbeat
from .backends import Backend, BackendError
from .plan import NodePlan, Plan, PoolPlan, grow_order
from .scaling import Decision, Scaler, SignalWindow, Signals

log = logging.getLogger(__name__)


class AutoscalerActor(LoopActor):
    def __init__(self, supervisor, name: str, plan: Plan, cfg: JobConfig, bootstrap: str, backend: Backend,
                 report_hours: bool = True) -> None:
        super().__init__(supervisor, name)
        self.plan, self.cfg, self.bootstrap, self.backend = plan, cfg, bootstrap, backend
        self.report_hours = report_hours  # one actor per job reports device-hours (one per policy runs)
        self.spec = plan.autoscaler
        self.policy = cfg.policy
        self.topics = job_topics(cfg)
        self.pools = [p for p in plan.pools.values() if p.component == "raas" and p.policy == self.policy]
        self.enabled = bool(self.spec["enabled"]) and any(p.elastic for p in self.pools)
        self.producer = self.control = self.metrics_in = self.drops = self.admin = None

    def setup(self) -> None:
        self.producer = Producer(self.bootstrap, client_id=self.name)
        self.dead = DeadLetters(self.producer, self.topics.dlq, self.name, recall=self.bootstrap)
        self.metrics = MetricsEmitter(self.producer, self.topics.metrics, self.name)
        self.control, self.metrics_in, self.drops = (
            self._from_beginning(topic, expect) for topic, expect in (
                (self.topics.control, (Heartbeat, SnapshotRequest)), (self.topics.metrics, (Metric,)),
                (self.topics.drops(self.policy), (GroupDrop,))))
        self.admin = security.admin(bootstrap_servers=self.bootstrap, client_id="autoscaler")
        self.hours = DeviceHours(self.plan)
        self.window = SignalWindow(self.policy, self.spec["window_s"], self._policy_of, self.cfg.rollout.heartbeat_s)
        self.scaler = Scaler(sum(p.min for p in self.pools), sum(p.max for p in self.pools), **self.spec)
        self.next_eval = 0.0
        if self.enabled:
            for pool in self.pools:
                while pool.elastic and len(self.backend.members(pool.name)) < pool.count:
                    if self._start(pool) is None:
                        break  # the backend failed (reported): later decisions grow the pool, not a loop here

    def _from_beginning(self, topic: str, expect: tuple) -> Consumer:
        c = Consumer(self.bootstrap, partitions=[TopicPartition(topic, 0)], client_id="autoscaler",
                     dead_letters=self.dead, expect=expect)
        c.seek_to_beginning()
        return c

    def _policy_of(self, node_id: str) -> str | None:
        pool = self.plan.pool_of(node_id)
        return pool.policy if pool is not None else None

    def step(self) -> None:
        for d in self.control.poll(100):
            if isinstance(d.message, Heartbeat):
                self.hours.observe(d.message)
                self.window.add_heartbeat(d.message)
        for d in self.metrics_in.poll(100):
            if isinstance(d.message, Metric):
                self.window.add_metric(d.message)
        for d in self.drops.poll(50):
            if isinstance(d.message, GroupDrop) and d.message.reason == "stale":
                self.window.add_stale_drop(d.message.ts or time.time())
        now = time.time()
        if now < self.next_eval:
            return
        self.next_eval = now + self.spec["interval_s"]
        if self.report_hours:
            self._report_hours()
        self._report_sizes()
        if self.enabled:
            self._decide(now)

    def _decide(self, now: float) -> None:
        s = self.window.signals(now, since=self.scaler.last_action)
        s = Signals(s.wait_frac, s.demand, s.stale_drops, s.span_s, s.steps, s.trainer_done, self._lag())
        current = self._size()
        d = self.scaler.decide(s, current, now)
        self._report(s, d)
        if d.action == "up":
            started = [n.node_id for n in (self._grow() for _ in range(d.target - current)) if n is not None]
            self._acted(d, started)
        elif d.action == "down":
            retired = [n for n in (self._shrink() for _ in range(current - d.target)) if n is not None]
            self._acted(d, retired)

    def _size(self) -> int:
        return sum(len(self.backend.members(p.name)) if p.elastic else p.count for p in self.pools)

    def _grow(self) -> NodePlan | None:
        for pool in grow_order(self.plan, self.policy):
            if len(self.backend.members(pool.name)) < pool.max:
                return self._start(pool)
        return None

    def _shrink(self) -> str | None:
        for pool in reversed(grow_order(self.plan, self.policy)):
            members = self.backend.members(pool.name)
            if len(members) > pool.min:
                node_id = members[-1]  # the newest: the oldest has the warmest weights cache
                try:
                    self.backend.retire(node_id)
                except BackendError as e:
                    self._backend_error(e)
                    return None
                return node_id
        return None

    def _start(self, pool: PoolPlan) -> NodePlan | None:
        node = self.plan.node_spec(pool, self.backend.next_index(pool.name))
        self.producer.send(self.topics.control, starting_heartbeat(node.node_id, node.role, node.policy, time.time()),
                           key=node.node_id, trace=False)
        try:
            self.backend.start(node)
        except BackendError as e:
            self._backend_error(e)
            return None
        return node

    def _backend_error(self, e: BackendError) -> None:
        log.error("autoscaler: %s", e)
        self.metrics.emit("autoscaler.backend_error", 1, error=str(e))

    def _lag(self) -> int | None:
        """Task lag of the policy's RaaS group (offsets not yet committed, incl. transaction markers)."""
        topic, group = self.topics.tasks(self.policy), self.topics.rollout_group(self.policy)
        try:
            tps = self.control.partitions_of(topic)
            ends = self.control.end_offsets(tps)
            committed = self.admin.list_group_offsets(group).get(group, {})
        except Exception as e:  # noqa: BLE001 - lag is for the record (no group before the first node joins)
            log.debug("autoscaler: task lag unavailable: %s", e)
            return None
        return sum(max(0, ends[tp] - (committed[tp].offset if tp in committed and committed[tp].offset >= 0 else 0))
                   for tp in tps)

    def _report(self, s: Signals, d: Decision) -> None:
        labels = {"policy": self.policy}
        values = {"autoscaler.demand": s.demand, "autoscaler.stale_drops": s.stale_drops}
        if s.wait_frac is not None:
            values["autoscaler.wait_frac"] = s.wait_frac
        if s.lag is not None:
            values["autoscaler.lag"] = s.lag
        self.metrics.emit_many(values, **labels)
        self.metrics.emit("autoscaler.target", d.target, action=d.action, reason=d.reason, **labels)

    def _report_sizes(self) -> None:
        """The policy's pool size (also with scaling off: plots and status show it)."""
        self.metrics.emit("autoscaler.pool_size", self._size(), policy=self.policy)
        for p in self.pools:
            self.metrics.emit("autoscaler.pool_nodes", len(self.backend.members(p.name)) if p.elastic else p.count,
                              pool=p.name, policy=self.policy)

    def _acted(self, d: Decision, nodes: list[str]) -> None:
        log.info("autoscaler: %s %d -> %d (%s): %s", d.action, d.current, d.target, d.reason, ", ".join(nodes))
        self.metrics.emit("autoscaler.scaled", d.current + (len(nodes) if d.action == "up" else -len(nodes)),
                          action=d.action, current=d.current, target=d.target, reason=d.reason, nodes=nodes,
                          policy=self.policy)

    def _report_hours(self) -> None:
        t = self.hours.totals()
        for name, p in t["pools"].items():
            self.metrics.emit("devices.hours", p["device_hours"], pool=name, kind=p["kind"], role=p["role"],
                              cost=p["cost"], node_hours=p["node_hours"])
        self.metrics.emit("devices.total_hours", t["total"], rollout=t["rollout"], trainer=t["trainer"],
                          cost=t["cost"])
        s = self.backend.accounted_hours()  # the scheduler's own count (Slurm), beside the heartbeats'
        if s is not None:
            for name, p in s["pools"].items():
                self.metrics.emit("devices.scheduler_hours", p["device_hours"], pool=name, kind=p["kind"],
                                  role=p["role"], cost=p["cost"], cpu_hours=p["cpu_hours"], jobs=p["jobs"])
            self.metrics.emit("devices.scheduler_total_hours", s["total"], rollout=s["rollout"], trainer=s["trainer"],
                              cost=s["cost"])

    def teardown(self) -> None:
        if self.producer is not None and self.report_hours:
            try:
                self._report_hours()
            except Exception:  # noqa: BLE001 - the run's summary recounts from the topics anyway
                log.warning("autoscaler: final device-hours report failed", exc_info=True)
        close_quietly(self.control, self.metrics_in, self.drops, self.admin, self.producer)
        self.producer = self.control = self.metrics_in = self.drops = self.admin = None
