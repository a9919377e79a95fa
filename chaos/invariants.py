"""Audit a job's topics: the conservation law, computed from the log alone.

Reads ``tasks.<policy>``, ``trajectories``, ``batches.<policy>``, ``drops.<policy>`` and the
newest ``dataflow-state.<policy>`` record as a plain ``read_committed`` consumer would
(only what was committed exists) and checks (DESIGN.md §7):

* every task has exactly one committed trajectory group (an explicit ``failed`` group
  counts), and every group answers a task that exists;
* every group record is settled exactly once: in one batch (ok groups only) or named by
  one drop record with a known reason. A group in no batch and no drop is a violation
  whatever the reason: a finished run leaves nothing in flight, so an audit of a running
  job fails until it settles (poll it). A group may appear in further batches only when
  marked there as a replay, and only after the batch that trained it fresh;
* batch sources and drop records point at records that hold the groups they name;
  batches are numbered 0, 1, 2, ... without a gap;
* every fresh sample respects the staleness bound: a token generated at version ``v``
  is in a batch ``k`` with ``k - v <= max_staleness`` (replays are stale by design), and
  ``v <= k``: version ``v`` exists once ``v`` batches were trained, so a token ahead of its
  batch carries another policy's version (a shared pool that mixed up its adapters' versions);
* the dataflow's newest state agrees with the log (tasks scheduled, slots freed by drops,
  next step, nothing open), so the counts it restarts from are the ones the log implies;
* with the job's content limits (:func:`content_limits`), every group's content is checked
  as the dataflow checks it (:func:`astraflow.actors.group_checks.impossible`, with the
  task's own prompt and ``n_samples``): a group found impossible is counted in
  ``rejected_groups`` by its reason and must not be in a batch, and a drop that names a
  content reason (or ``unknown_task``) must name a group that fails that check. A group
  refused and then dropped silently (no drop record) is a group never settled.

Multi-policy jobs (:func:`audit_job`): a task is an episode on the lead policy's
``tasks.<lead>``; it owes each policy one group per role that policy trains on it
(``Task.train``), keyed ``<task>/<role>`` (``TrajectoryGroup.group_key``). Each policy is
audited as above over those keys, and the episodes as a whole: every group of an episode
was written by one node (its runner's single transaction), never some roles by one run
and the others by another.

A running job (``astraflow run``'s audit every ``audit.every_versions``) is audited on the
same records: :attr:`Audit.unsettled` are the findings of work still in flight (a task
without its group yet, a group not yet batched or dropped, a dataflow state behind the
log), which a finished job must not show and a running one may; every other violation
(:attr:`Audit.definitive`: a task scheduled twice, two groups for one task, a group for a
task never scheduled, a group trained twice, a gap in the batch steps, ...) stays one
whatever comes next. The log is read effects first (state, batches, drops, groups, tasks),
so a record read always finds what caused it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from astraflow.topics import Batch, JobTopics, Task, TrajectoryGroup
from astraflow.topics.messages import DROP_REASONS, DataflowState, GroupDrop
from astraflow.topics.replay import read_topic

Coord = tuple[int, int]  #: (partition, offset) of a record on ``trajectories``


@dataclass
class JobLog:
    """What the audit reads: the committed records of one policy's pipeline."""

    tasks: list[Task]
    groups: list[tuple[int, int, TrajectoryGroup]]  #: (partition, offset, group) on ``trajectories``
    batches: list[Batch]
    drops: list[GroupDrop]
    state: DataflowState | None = None  #: the dataflow's newest state record
    rejected: Counter = field(default_factory=Counter)  #: unsigned or forged group records, by reason
    limits: object | None = None  #: the policy's ``GroupLimits``: check every group's content (None: do not)


@dataclass
class Audit:
    tasks: int = 0
    groups: int = 0
    batches: int = 0
    batched_groups: int = 0  #: fresh groups in batches
    replayed_groups: int = 0  #: replay-marked groups in batches
    failed_groups: int = 0
    drops: Counter = field(default_factory=Counter)  #: drop records by reason
    max_staleness_seen: int = 0
    #: group records on ``trajectories`` not signed by the job's RaaS pool (forged): never a
    #: task's group, by reason; and signed groups whose content is impossible (``token_out_of_vocab``,
    #: ``unknown_task``, ...: groups of their tasks that must be dropped, never trained)
    rejected_groups: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    #: the violations that only say "not settled yet" (also in ``violations``)
    unsettled: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def definitive(self) -> list[str]:
        """The violations no later record can repair: what fails a running job's audit too."""
        pending = Counter(self.unsettled)
        out = []
        for v in self.violations:
            if pending[v]:
                pending[v] -= 1
            else:
                out.append(v)
        return out

    def not_settled(self, finding: str) -> None:
        """A violation of a finished job that a running one shows while work is in flight."""
        self.violations.append(finding)
        self.unsettled.append(finding)


def owed_keys(task: Task, policy: str) -> list[str]:
    """The group keys ``task`` owes ``policy``: its one group, or one per role it trains there."""
    if not task.roles:
        return [task.task_id] if task.policy == policy else []
    train = task.train or list(task.roles)
    return [f"{task.task_id}/{r}" for r in train if task.roles.get(r) == policy] if len(task.roles) > 1 else \
        [task.task_id for r in train if task.roles.get(r) == policy]


def read_log(bootstrap: str, topics: JobTopics, policy: str, lead: str | None = None, verifier=None,
             limits=None) -> JobLog:
    """``lead``: the policy whose tasks topic holds the episodes (default ``policy``).
    ``verifier``: what the dataflow checks groups with (:func:`group_verifier`): a group record
    it refuses is no group of its task, only counted in ``rejected`` (None: every record counts).
    ``limits``: what the policy's groups may hold (:func:`content_limits`; None: not checked).

    Effects before causes: a batch or drop read here names a group committed before it, so
    before ``trajectories`` is read; a group, a task committed before ``tasks`` is read. On a
    running job that keeps "names a record that is not there" a real finding."""
    states = [m for _, _, m in read_topic(bootstrap, topics.dataflow_state(policy), tail=64)
              if isinstance(m, DataflowState) and m.policy == policy]
    batches = [m for _, _, m in read_topic(bootstrap, topics.batches(policy)) if isinstance(m, Batch)]
    drops = [m for _, _, m in read_topic(bootstrap, topics.drops(policy)) if isinstance(m, GroupDrop)]
    groups, rejected = [], Counter()
    for p, o, m, hdrs in read_topic(bootstrap, topics.trajectories, headers=True):
        if not isinstance(m, TrajectoryGroup) or m.policy != policy:
            continue
        reason = _refused(verifier, topics.trajectories, m, hdrs)
        if reason:
            rejected[reason] += 1
        else:
            groups.append((p, o, m))
    tasks = [m for _, _, m in read_topic(bootstrap, topics.tasks(lead or policy)) if isinstance(m, Task)]
    return JobLog(tasks=tasks, groups=groups, batches=batches, drops=drops, state=states[-1] if states else None,
                  rejected=rejected, limits=limits)


def _refused(verifier, topic: str, group: TrajectoryGroup, headers) -> str | None:
    if verifier is None or not verifier.checks:
        return None
    from astraflow.weights.signing import SignatureError
    try:
        verifier.check_message(topic, group, headers)
        return None
    except SignatureError as e:
        return e.reason


def group_verifier(cfg):
    """The check the dataflow makes of a job's groups (the lead pool's key), or None when the
    config names no key to check with (the audit then counts every group record)."""
    from astraflow.actors.signing import group_verifier_for
    from astraflow.typed_config import ConfigError
    try:
        return group_verifier_for(cfg.view(cfg.lead_policy))
    except ConfigError:
        return None


def content_limits(cfg, policy: str | None = None):
    """What the dataflow checks the content of ``policy``'s groups against (default: the
    job's policy): :func:`astraflow.actors.group_checks.limits_for`."""
    from astraflow.actors.group_checks import limits_for
    return limits_for(cfg, policy or cfg.policy)


def audit(bootstrap: str, topics: JobTopics, policy: str, max_staleness: int, lead: str | None = None,
          verifier=None, limits=None) -> Audit:
    """Read the job's topics and check them; ``Audit.ok`` when nothing is violated."""
    return check(read_log(bootstrap, topics, policy, lead, verifier, limits), max_staleness, policy)


def audit_job(bootstrap: str, cfg) -> dict[str, Audit]:
    """Every policy of a job config, and its episodes; ``"episodes"`` holds the cross-policy checks."""
    from astraflow.topics import job_topics
    topics, lead = job_topics(cfg), cfg.lead_policy
    verifier = group_verifier(cfg)
    logs = {p: read_log(bootstrap, topics, p, lead, verifier, content_limits(cfg, p)) for p in cfg.policy_names}
    out = {p: check(log, cfg.view(p).effective_staleness, p) for p, log in logs.items()}
    episodes = Audit(tasks=len(logs[lead].tasks))
    writers: dict[str, set[str]] = {}
    for log in logs.values():
        for _, _, g in log.groups:
            writers.setdefault(g.task_id, set()).add(g.node_id)
    for tid, nodes in sorted(writers.items()):
        if len(nodes) > 1:
            episodes.violations.append(f"episode {tid}: its groups were written by {sorted(nodes)}, not by one "
                                       f"runner in one transaction")
    out["episodes"] = episodes
    return out


def check(log: JobLog, max_staleness: int, policy: str | None = None) -> Audit:
    impossible = _impossible(log)  # before _owed: it reads the tasks' prompts and n_samples
    log = _owed(log, policy)  # multi-policy: ``tasks`` counts the groups the episodes owe this policy
    a = Audit(tasks=len(log.tasks), groups=len(log.groups), batches=len(log.batches),
              failed_groups=sum(1 for _, _, g in log.groups if g.status != "ok"),
              drops=Counter(d.reason for d in log.drops), rejected_groups=Counter(log.rejected))
    a.rejected_groups.update(reason for reason, _ in impossible.values())
    _check_tasks(log, a)
    _check_batches(log, a, max_staleness)
    _check_settlement(log, a)
    _check_content(log, a, impossible)
    _check_state(log, a)
    return a


def _impossible(log: JobLog) -> dict[Coord, tuple[str, str]]:
    """Where the groups whose content the dataflow must refuse are, and why (the check's
    name and detail); empty without ``log.limits``."""
    if log.limits is None:
        return {}
    from astraflow.actors.group_checks import impossible
    tasks = {t.task_id: t for t in log.tasks}
    out: dict[Coord, tuple[str, str]] = {}
    for p, o, g in log.groups:
        task = tasks.get(g.task_id)
        if task is None:
            out[(p, o)] = ("unknown_task", f"task {g.task_id} was never scheduled")
            continue
        found = impossible(g, log.limits, prompt_bytes=len(task.prompt.encode()), n_samples=task.n_samples)
        if found is not None:
            out[(p, o)] = found
    return out


def _check_content(log: JobLog, a: Audit, impossible: dict[Coord, tuple[str, str]]) -> None:
    """An impossible group is never trained; a drop for its content names an impossible group."""
    if log.limits is None:
        return
    from astraflow.actors.group_checks import CONTENT_REASONS
    for b in log.batches:
        for j, (src, g) in enumerate(zip(b.sources, b.groups)):
            found = impossible.get((src.partition, src.offset))
            if found is not None and not b.is_replay(j):
                a.violations.append(f"batch {b.step}: group {g.task_id} at trajectories[{src.partition}]@"
                                    f"{src.offset} was trained, but its content is impossible: {found[0]}: "
                                    f"{found[1]}")
    for d in log.drops:
        if d.reason not in CONTENT_REASONS:
            continue
        found = impossible.get((d.source.partition, d.source.offset))
        if found is None:
            a.violations.append(f"drop record ({d.reason}) names {d.task_id} at ({d.source.partition}, "
                                f"{d.source.offset}), whose content passes every check")


@dataclass
class _Owed:
    task_id: str


def _owed(log: JobLog, policy: str | None) -> JobLog:
    """The log with ``tasks`` replaced by the group keys the policy is owed (one per task and
    role it trains); a single-policy log is unchanged."""
    if policy is None or not any(t.roles for t in log.tasks):
        return log
    keys = [_Owed(k) for t in log.tasks for k in owed_keys(t, policy)]
    return JobLog(keys, log.groups, log.batches, log.drops, log.state, log.rejected,  # type: ignore[arg-type]
                  log.limits)


def _check_tasks(log: JobLog, a: Audit) -> None:
    task_ids = Counter(t.task_id for t in log.tasks)
    for tid, n in task_ids.items():
        if n > 1:
            a.violations.append(f"task {tid} scheduled {n} times")
    group_ids = Counter(g.group_key for _, _, g in log.groups)
    for tid, n in group_ids.items():
        if n > 1:
            a.violations.append(f"task {tid} has {n} committed trajectory groups")
        if tid not in task_ids:
            a.violations.append(f"trajectory group for unknown task {tid}")
    for tid in task_ids:
        if tid not in group_ids:
            a.not_settled(f"task {tid} has no trajectory group")


def _check_batches(log: JobLog, a: Audit, max_staleness: int) -> None:
    for i, b in enumerate(log.batches):
        if b.step != i:
            a.violations.append(f"batch #{i} has step {b.step}")
        if b.replay and len(b.replay) != len(b.groups):
            a.violations.append(f"batch {b.step}: {len(b.groups)} groups but {len(b.replay)} replay marks")
        for j, g in enumerate(b.groups):
            if b.is_replay(j):
                a.replayed_groups += 1
                continue
            a.batched_groups += 1
            for s in g.samples:
                own = s.own_versions()
                if own and max(own) > b.step:
                    a.violations.append(f"batch {b.step}: group {g.group_key} has a token of version {max(own)}, "
                                        f"ahead of the batch (not a version of policy {g.policy} yet)")
                if own:
                    lag = b.step - min(own)
                    a.max_staleness_seen = max(a.max_staleness_seen, lag)
                    if lag > max_staleness:
                        a.violations.append(f"batch {b.step}: group {g.group_key} has a token of version "
                                            f"{min(own)} (staleness {lag} > {max_staleness})")
        if len(b.sources) != len(b.groups):
            a.violations.append(f"batch {b.step}: {len(b.groups)} groups but {len(b.sources)} sources")


def _settlements(log: JobLog, a: Audit) -> dict[Coord, list[str]]:
    """Where each group record went (replays are checked here, and are no settlement)."""
    held = {(p, o): g for p, o, g in log.groups}
    out: dict[Coord, list[str]] = {}
    trained_at: dict[Coord, int] = {}
    replays: list[tuple[int, Coord, str]] = []
    for b in log.batches:
        for j, (src, g) in enumerate(zip(b.sources, b.groups)):
            coord = (src.partition, src.offset)
            if held.get(coord) is None or held[coord].group_key != g.group_key:
                a.violations.append(f"batch {b.step}: source {src} does not hold group {g.task_id}")
                continue
            if held[coord].status != "ok":
                a.violations.append(f"batch {b.step}: group {g.task_id} at {coord} failed and cannot be trained")
            if b.is_replay(j):
                replays.append((b.step, coord, g.task_id))
                continue
            trained_at.setdefault(coord, b.step)
            out.setdefault(coord, []).append(f"batch {b.step}")
    for step, coord, tid in replays:
        if trained_at.get(coord, step) >= step:
            a.violations.append(f"batch {step}: group {tid} at {coord} is marked as a replay but no earlier "
                                f"batch trained it")
    for d in log.drops:
        coord = (d.source.partition, d.source.offset)
        if d.reason not in DROP_REASONS:
            a.violations.append(f"drop record for {d.task_id} has unknown reason {d.reason!r}")
        if held.get(coord) is None or held[coord].group_key != d.task_id:
            a.violations.append(f"drop record ({d.reason}) names {d.task_id} at {coord}, which does not hold it")
            continue
        out.setdefault(coord, []).append(f"drop ({d.reason}, step {d.step})")
    return out


def _check_settlement(log: JobLog, a: Audit) -> None:
    settled = _settlements(log, a)
    for p, o, g in log.groups:
        where = settled.get((p, o), [])
        if not where:
            a.not_settled(f"group {g.task_id} at trajectories[{p}]@{o} is neither batched nor dropped")
        elif len(where) > 1:
            a.violations.append(f"group {g.task_id} at trajectories[{p}]@{o} is settled {len(where)} times: "
                                f"{', '.join(where)}")


def _check_state(log: JobLog, a: Audit) -> None:
    s = log.state
    if s is None:
        if log.tasks or log.batches or log.drops:
            a.not_settled("no dataflow state record, but the dataflow wrote tasks, batches or drops")
        return
    freed = sum(1 for d in log.drops if DROP_REASONS.get(d.reason))
    for what, counted, logged in (("tasks scheduled", s.tasks_scheduled, len(log.tasks)),
                                  ("slots freed by drops", s.groups_dropped, freed),
                                  ("next step", s.next_step, len(log.batches))):
        if counted != logged:
            a.not_settled(f"dataflow state says {counted} {what}, the log shows {logged}")
    if s.open_tasks:
        a.not_settled(f"dataflow state has {len(s.open_tasks)} open task(s), e.g. {s.open_tasks[:3]}")
