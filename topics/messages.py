"""Typed records carried by the job's topics.

Every message is a frozen dataclass with a class-level ``TYPE`` (the ``af-type`` header)
and ``SCHEMA`` (the ``af-schema`` header, bumped on any incompatible change). One
registry, :data:`MESSAGE_TYPES`, maps ``af-type`` to class. Encoding lives in
:mod:`.codec`; this module holds only the shapes and what each field means.
Lists stay lists (not tuples) because they are decoded straight from JSON arrays.
A message class is a plain dataclass: no ``__init__`` of its own, since decoding fills a
record's fields in without calling it (a ``__post_init__`` makes decoding call it).

The codec checks every field's scalar type against its annotation; a class's
``validate()`` adds the bounds only its meaning gives (lists that must be as long as each
other, ids and steps that cannot be negative) and raises ``ValueError`` naming the field:
decoding turns that into a dead letter. Bounds that need a component's knowledge (the
model's vocabulary, the trainer's last step) are checked by that component.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from .packed import Flags, Floats, Ints, pack_fields

MESSAGE_TYPES: dict[str, type["Message"]] = {}


def _non_negative(name: str, values: Sequence[int]) -> None:
    if values and min(values) < 0:
        raise ValueError(f"{name} holds {min(values)}; ids, versions and steps are >= 0")


def _check_sampling(sampling: dict[str, Any]) -> None:
    """The sampling keys engines read, when present: numbers in their ranges."""
    for key, lo, hi, whole in (("temperature", 0.0, None, False), ("top_p", 0.0, 1.0, False),
                               ("top_k", 0, None, True), ("max_new_tokens", 1, None, True)):
        if key not in sampling:
            continue
        v = sampling[key]
        if type(v) not in ((int,) if whole else (int, float)) or v < lo or (hi is not None and v > hi) \
                or (key == "top_p" and v == 0):
            raise ValueError(f"sampling[{key!r}] is {v!r:.40}; it is {'an int' if whole else 'a number'} "
                             f">= {lo}" + (f" and <= {hi}" if hi is not None else ""))
    # a role call's stop sequences (GenerationRequest): stop strings and stop token ids
    stop = sampling.get("stop")
    if stop is not None and (type(stop) is not list or not all(type(x) is str and x for x in stop)):
        raise ValueError(f"sampling['stop'] is {stop!r:.60}; it is a list of non-empty strings")
    ids = sampling.get("stop_token_ids")
    if ids is not None and (type(ids) is not list or not all(type(x) is int and x >= 0 for x in ids)):
        raise ValueError(f"sampling['stop_token_ids'] is {ids!r:.60}; it is a list of token ids (ints >= 0)")


def _same_length(name: str, values: Sequence, other: str, n: int, may_be_empty: bool = False) -> None:
    if len(values) != n and not (may_be_empty and not values):
        raise ValueError(f"{name} has {len(values)} entries but {other} has {n}"
                         + ("; leave it empty or give one per entry" if may_be_empty else ""))


def register(cls: type["Message"]) -> type["Message"]:
    """Class decorator: add a message class to :data:`MESSAGE_TYPES` under its ``TYPE``."""
    if cls.TYPE in MESSAGE_TYPES:
        raise ValueError(f"af-type {cls.TYPE!r} registered twice")
    MESSAGE_TYPES[cls.TYPE] = cls
    return cls


@dataclass(frozen=True)
class Message:
    """Base of all topic payloads."""

    TYPE: ClassVar[str] = ""
    SCHEMA: ClassVar[int] = 1
    #: Fields this type no longer has that records written before may still carry: accepted
    #: and ignored on decode, never written (removing a field breaks no reader either way).
    RETIRED: ClassVar[frozenset[str]] = frozenset()


@register
@dataclass(frozen=True)
class Prompt(Message):
    """One input problem on the ``prompts`` topic."""

    TYPE: ClassVar[str] = "prompt"
    prompt_id: str
    text: str  #: the prompt as text (engines tokenize it)
    answer: str  #: reference answer used by the reward function
    source: str = ""  #: dataset name / file the prompt came from
    metadata: dict[str, Any] = field(default_factory=dict)


@register
@dataclass(frozen=True)
class Task(Message):
    """A rollout request on ``tasks.<policy>``: roll out ``n_samples`` completions of a prompt.

    Schema 2 removed ``attempt``: Kafka does not count redeliveries and nothing did, and
    sample seeds derive from ``task_id`` alone, so a redelivered task reproduces its samples.
    Schema 3 added the episode fields ``roles`` and ``train``: a task is one episode of
    ``workflow``; it returns one group per role in ``train``. Every role plays its part
    whether trained or not; the dataflow leaves out of ``train`` only a policy that already
    has every group its training needs (an episode that replaces another policy's dropped
    group at the end of a job). Records of earlier jobs may also leave out a policy whose
    staleness bound was full, as the dataflow's admission then did.
    """

    TYPE: ClassVar[str] = "task"
    SCHEMA: ClassVar[int] = 3
    task_id: str
    prompt_id: str
    policy: str
    prompt: str
    answer: str
    n_samples: int
    sampling: dict[str, Any] = field(default_factory=dict)  #: temperature, top_p, max_new_tokens, ...
    workflow: str = "rlvr"  #: which workflow turns the task into trajectories
    role: str = "solver"
    scheduled_version: int = 0  #: policy version the dataflow saw when it scheduled the task
    created_at: float = 0.0
    roles: dict[str, str] = field(default_factory=dict)  #: role -> policy; empty: ``role`` of ``policy``
    train: list[str] = field(default_factory=list)  #: roles whose groups the episode returns; empty: all
    params: dict[str, Any] = field(default_factory=dict)  #: the workflow's parameters
    metadata: dict[str, Any] = field(default_factory=dict)  #: the prompt's metadata (hidden tests, ...)
    scheduled_versions: dict[str, int] = field(default_factory=dict)  #: per policy, as ``scheduled_version``

    def validate(self) -> None:
        if self.n_samples < 1:
            raise ValueError(f"n_samples is {self.n_samples}; a task asks for at least one sample")
        _non_negative("scheduled_version", [self.scheduled_version, *self.scheduled_versions.values()])
        _check_sampling(self.sampling)


@dataclass(frozen=True)
class Sample:
    """One completion of a trajectory group.

    Its number arrays are packed (:mod:`.packed`): a list or tuple given to the constructor
    becomes :class:`~.packed.Ints` / :class:`~.packed.Floats` / :class:`~.packed.Flags`, which
    read, compare and concatenate as lists do.
    """

    tokens: Ints  #: generated token ids (the prompt is in the group)
    logprobs: Floats  #: behaviour-policy logprob of each generated token
    versions: Ints  #: policy version that generated each token
    reward: float
    finish_reason: str  #: "stop", "length" or "context" (the model's window was full)
    text: str = ""
    #: this sample's context (the tokens before ``tokens``); empty: the group's ``prompt_ids``
    #: (the task's prompt), which is what nodes write when the two are equal. A sample never
    #: has an empty context: its first token is trained as predicted from the one before.
    prompt_ids: Ints = field(default_factory=Ints)
    #: per token: 1 trained on, 0 context written by another role or the environment
    #: (its logprob and version are 0); empty: every token is trained on
    loss_mask: Flags = field(default_factory=Flags)
    #: per token: index into the group's ``roles`` of who wrote it; empty: the group's role
    token_roles: Flags = field(default_factory=Flags)
    info: dict[str, Any] = field(default_factory=dict)  #: the workflow's per-trajectory facts (attempt, verdict)

    __post_init__ = pack_fields

    def validate(self) -> None:
        n = len(self.tokens)
        if len(self.logprobs) == n == len(self.versions) and not self.loss_mask and not self.token_roles:
            return  # the common record in one expression (a poll decodes thousands of samples)
        _same_length("logprobs", self.logprobs, "tokens", n)
        _same_length("versions", self.versions, "tokens", n)
        _same_length("loss_mask", self.loss_mask, "tokens", n, may_be_empty=True)
        _same_length("token_roles", self.token_roles, "tokens", n, may_be_empty=True)
        # Token ids are bounded by the model's vocabulary where it is known (the trainer);
        # checking them here too would double the cost of decoding a trajectory.
        if self.loss_mask and not set(self.loss_mask) <= {0, 1}:
            raise ValueError(f"loss_mask holds {sorted(set(self.loss_mask) - {0, 1})[:5]}; only 0 and 1 mean anything")

    def trained(self) -> int:
        """Tokens trained on."""
        return sum(self.loss_mask) if self.loss_mask else len(self.tokens)

    def own_versions(self) -> Sequence[int]:
        """Versions of the tokens this role generated (context tokens carry none)."""
        if not self.loss_mask:
            return self.versions
        return [v for v, m in zip(self.versions, self.loss_mask) if m]


@register
@dataclass(frozen=True)
class TrajectoryGroup(Message):
    """All samples of one role in one task (an episode), on ``trajectories``; every role's
    group of an episode is written in the one transaction that commits the task.

    Schema 2 added the multi-role fields: ``role``, ``roles`` and ``role_policies`` (who wrote
    the tokens; samples index ``roles`` per token), the per-sample loss mask, and ``stats``
    (the role's group statistics and the episode's team outcome). Schema 1 records decode
    with their defaults: one role, every token trained on. Schema 3 writes the number arrays
    (``prompt_ids`` and each sample's) packed, as hex strings (:mod:`.packed`); the JSON
    arrays of earlier records decode to the same packed types.
    """

    TYPE: ClassVar[str] = "trajectory-group"
    SCHEMA: ClassVar[int] = 3
    task_id: str
    prompt_id: str
    policy: str
    node_id: str
    prompt_ids: Ints  #: the task's prompt, tokenized: the context of every sample that names none of its own
    samples: list[Sample]
    scheduled_version: int = 0
    started_at: float = 0.0
    finished_at: float = 0.0
    status: str = "ok"  #: "ok", or "failed" after retries (then ``error`` says why)
    error: str = ""
    role: str = ""  #: the workflow role these samples train ("" in schema 1: the only one)
    roles: list[str] = field(default_factory=list)  #: writers indexed by ``Sample.token_roles``
    role_policies: dict[str, str] = field(default_factory=dict)  #: role -> policy in this episode
    stats: dict[str, Any] = field(default_factory=dict)  #: reward_mean/std, n, team_reward, workflow metrics

    #: the group statistics the dataflow computes with: numbers when present
    NUMERIC_STATS: ClassVar[tuple[str, ...]] = ("reward_mean", "reward_std", "n", "team_reward")

    __post_init__ = pack_fields

    def validate(self) -> None:
        if self.status not in ("ok", "failed"):
            raise ValueError(f"status is {self.status[:40]!r}; it is 'ok' or 'failed'")
        for s in self.samples:
            if s.token_roles:
                self._check_writers()
                break
        stats = self.stats
        if stats:
            for k in self.NUMERIC_STATS:
                v = stats.get(k)
                if v is not None and type(v) not in (int, float):
                    raise ValueError(f"stats[{k!r}] is {type(v).__name__}, not a number")

    def _check_writers(self) -> None:
        for i, s in enumerate(self.samples):
            if s.token_roles and not 0 <= min(s.token_roles) <= max(s.token_roles) < max(1, len(self.roles)):
                raise ValueError(f"samples[{i}].token_roles names writers {min(s.token_roles)}..{max(s.token_roles)} "
                                 f"but the group has {len(self.roles)} role(s)")

    @property
    def group_key(self) -> str:
        """What the dataflow opens and settles: the task for a one-role group, else task/role."""
        return f"{self.task_id}/{self.role}" if self.role and len(self.role_policies) > 1 else self.task_id


@register
@dataclass(frozen=True)
class GenerationRequest(Message):
    """A role's ``generate`` call served by another policy's pool, on ``generate.<policy>``.

    At-least-once: a pool node that dies before answering leaves the request to the next
    member of ``gen.<policy>``; the episode takes the first reply per ``request_id`` and the
    seeds make a repeated answer the same sample. Retired: ``reply_to`` (replies find their
    episode by key and ``request_id``) and ``min_version`` (written, never enforced: a
    lockstep job's barrier is the dataflow's). There is no version floor on the wire: a
    server answers with the weights it holds when it serves the request and each reply row
    says which version that was (:attr:`GenerationReply.versions`).

    Schema 2 added ``reply_partition``: the requester reads only that partition of
    ``replies`` (``JobTopics.reply_partition`` of its node id), so a node's reply traffic
    does not grow with the number of requesting nodes; -1 (schema 1 records) answers by key.

    A call's stop sequences travel in ``sampling``, in SGLang's names: ``stop`` (strings) and
    ``stop_token_ids`` (besides the serving policy's end-of-sequence token); a server stops
    each row at the first one, keeping its tokens (absent in older records: stop at EOS only).
    """

    TYPE: ClassVar[str] = "generation-request"
    SCHEMA: ClassVar[int] = 2
    RETIRED: ClassVar[frozenset[str]] = frozenset({"reply_to", "min_version"})
    request_id: str
    episode_id: str
    policy: str
    role: str
    prompts: list[list[int]]
    seeds: list[int]
    sampling: dict[str, Any] = field(default_factory=dict)
    ts: float = 0.0
    reply_partition: int = -1  #: the partition of ``replies`` to answer on; -1: the key's

    def validate(self) -> None:
        _check_sampling(self.sampling)
        _same_length("seeds", self.seeds, "prompts", len(self.prompts))
        for row in self.prompts:
            _non_negative("prompts", row)


@register
@dataclass(frozen=True)
class GenerationReply(Message):
    """The answer to a :class:`GenerationRequest`, on ``replies`` keyed by episode, in the
    request's ``reply_partition``; the record's ``af-request`` header repeats ``request_id``
    so a requester passes over other requesters' replies without decoding them."""

    TYPE: ClassVar[str] = "generation-reply"
    request_id: str
    episode_id: str
    node_id: str
    tokens: list[list[int]]
    logprobs: list[list[float]]
    versions: list[int]  #: per row: the weight version that generated it
    finish_reasons: list[str]
    error: str = ""
    ts: float = 0.0

    def validate(self) -> None:
        n = len(self.tokens)
        _same_length("logprobs", self.logprobs, "tokens", n)
        _same_length("versions", self.versions, "tokens", n)
        _same_length("finish_reasons", self.finish_reasons, "tokens", n)
        for i, (row, lp) in enumerate(zip(self.tokens, self.logprobs)):
            _same_length(f"logprobs[{i}]", lp, f"tokens[{i}]", len(row))
            _non_negative(f"tokens[{i}]", row)


@dataclass(frozen=True)
class SourceOffset:
    """Where a record came from: enough to re-read it."""

    topic: str
    partition: int
    offset: int


@register
@dataclass(frozen=True)
class Batch(Message):
    """A training batch on ``batches.<policy>``; ``step`` is the trainer step it feeds.

    Schema 2 added ``replay``: a group marked there was trained fresh by an earlier batch
    and is taken again from the replay buffer (the audit allows a group in several
    batches only so). Empty (as in schema 1 records) means every group is fresh. Schema 3:
    its groups are schema 3 trajectory groups (packed number arrays).
    """

    TYPE: ClassVar[str] = "batch"
    SCHEMA: ClassVar[int] = 3
    policy: str
    step: int
    groups: list[TrajectoryGroup]
    sources: list[SourceOffset]  #: the trajectory records this batch consumed
    stats: dict[str, Any] = field(default_factory=dict)
    replay: list[bool] = field(default_factory=list)  #: per group: replayed (True) or fresh; empty: all fresh

    def validate(self) -> None:
        if self.step < 0:
            raise ValueError(f"step is {self.step}; steps count from 0")
        _same_length("sources", self.sources, "groups", len(self.groups))
        _same_length("replay", self.replay, "groups", len(self.groups), may_be_empty=True)

    def is_replay(self, i: int) -> bool:
        return i < len(self.replay) and self.replay[i]


@register
@dataclass(frozen=True)
class GroupDrop(Message):
    """A trajectory group the dataflow consumed without batching it, on ``drops.<policy>``.

    Written in the transaction that commits the consumer offsets past the group, so the
    log accounts for every group: it is in exactly one batch or named by exactly one drop.
    """

    TYPE: ClassVar[str] = "group-drop"
    policy: str
    task_id: str
    source: SourceOffset  #: the ``trajectories`` record that was dropped
    reason: str  #: one of :data:`DROP_REASONS`
    step: int  #: the batch step being assembled when the group was dropped
    detail: str = ""
    ts: float = 0.0


#: Why a group is dropped, and whether the drop frees a scheduling slot (its task is
#: settled without a batch, so the dataflow schedules a replacement). A duplicate answers
#: a task that is already settled: it frees nothing. ``zero_variance`` is dynamic
#: sampling's (all samples rewarded alike: no signal; a replacement is scheduled);
#: ``filtered`` any other group filter's (the filter's name in ``detail``). The content
#: checks (``astraflow.actors.group_checks``) refuse a signed group whose content no engine
#: produces: it settles its task like a failed one (a replacement is scheduled), except
#: ``unknown_task``, a group for a task never published, which settles nothing.
DROP_REASONS: dict[str, bool] = {"failed": True, "stale": True, "duplicate": False, "zero_variance": True,
                                 "filtered": True, "group_size": True, "length_mismatch": True,
                                 "token_out_of_vocab": True, "length_over_limit": True, "reward_not_finite": True,
                                 "reward_out_of_range": True, "unknown_task": False}


@register
@dataclass(frozen=True)
class DataflowState(Message):
    """The dataflow's restart state, keyed by policy on compacted ``dataflow-state.<policy>``.

    Written in every dataflow transaction, next to the offsets it covers, so the newest
    record always agrees with the committed offsets and a restart reads this one record.
    Schema 2 added ``prompt_epoch`` and ``algorithms``.
    """

    TYPE: ClassVar[str] = "dataflow-state"
    SCHEMA: ClassVar[int] = 2
    policy: str
    next_step: int  #: step of the next batch
    tasks_scheduled: int  #: tasks written to ``tasks.<policy>`` so far
    groups_dropped: int  #: drops that freed a scheduling slot so far (failed, stale)
    open_tasks: list[str] = field(default_factory=list)  #: scheduled tasks not yet batched or dropped
    #: groups already batched or dropped that lie beyond the committed ``trajectories``
    #: offsets (behind a group still waiting for its batch): a restart re-reads and skips them
    settled_ahead: list[SourceOffset] = field(default_factory=list)
    ts: float = 0.0
    prompt_epoch: int = 0  #: passes over ``prompts`` begun (its offsets restart at each pass)
    #: the data algorithms' state (curators, skip counters, tags of open tasks), as of the
    #: groups these offsets settle; empty when no algorithm is configured
    algorithms: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ChunkRef:
    """One chunk of a chunked binary payload."""

    partition: int
    offset: int
    size: int
    digest: str  #: BLAKE3 (hex) of the chunk's bytes


@dataclass(frozen=True)
class ChunkManifest:
    """Where the chunks of one binary object live and how to verify them."""

    object_id: str
    topic: str
    total_bytes: int
    digest: str  #: ``manifest_digest(chunks)``: BLAKE3 over the chunks' sizes and digests, in order
    chunks: list[ChunkRef]
    #: the chunks' record timestamps (create time, ms), earliest and latest; -1: unknown (written
    #: before schema 4). Offsets hold only on the cluster the chunks were written to, timestamps
    #: also on a mirror (MirrorMaker 2 copies them): a reader there finds the chunks from these.
    first_timestamp_ms: int = -1
    last_timestamp_ms: int = -1


@register
@dataclass(frozen=True)
class VersionAnnouncement(Message):
    """A policy version is durable on ``weights.<policy>``; keyed by policy on compacted ``versions``.

    Compaction keeps only the latest announcement per policy, so each one carries the whole
    chain a late joiner needs: the newest snapshot and every delta after it, in order.
    Versions are ordered by ``(epoch, version)``: a trainer that resumes behind the announced
    head starts a new lineage epoch with a snapshot, and announcements of an older epoch are
    ignored (fenced) by subscribers. Schema 2 added ``delta_versions``; schema 3 ``epoch``;
    schema 4 the manifests' chunk timestamps (a mirror's readers locate chunks by them).
    """

    TYPE: ClassVar[str] = "version"
    SCHEMA: ClassVar[int] = 4
    policy: str
    version: int
    kind: str  #: "snapshot" (``version`` has a full snapshot, ``snapshot_manifest``) or "delta"
    base_version: int  #: version ``manifest`` applies to (== version when it is a snapshot)
    snapshot_version: int  #: newest full snapshot at or below ``version``
    manifest: ChunkManifest  #: the payload from ``base_version`` to ``version``: a delta or a snapshot
    checksum: str  #: digest of the full weights at ``version``
    snapshot_manifest: ChunkManifest | None = None  #: where ``snapshot_version`` lives
    deltas: list[ChunkManifest] = field(default_factory=list)  #: deltas after the snapshot, in order
    delta_versions: list[int] = field(default_factory=list)  #: the version each of ``deltas`` produces
    created_at: float = 0.0
    epoch: int = 0  #: lineage epoch; every payload of the chain belongs to it

    def validate(self) -> None:
        if self.kind not in ("snapshot", "delta"):
            raise ValueError(f"kind is {self.kind[:40]!r}; it is 'snapshot' or 'delta'")
        _same_length("delta_versions", self.delta_versions, "deltas", len(self.deltas), may_be_empty=True)


@register
@dataclass(frozen=True)
class Heartbeat(Message):
    """Liveness and load of a component, on ``control``. Schema 2 added ``epoch`` and ``weights_digest``,
    schema 3 ``error``. Retired: ``busy_slots`` / ``total_slots`` (never set by any node, never read)."""

    TYPE: ClassVar[str] = "heartbeat"
    SCHEMA: ClassVar[int] = 3
    RETIRED: ClassVar[frozenset[str]] = frozenset({"busy_slots", "total_slots"})
    node_id: str
    role: str  #: "raas", "trainer", "dataflow"
    policy: str
    version: int  #: policy version the node holds
    tokens_per_s: float = 0.0
    ts: float = 0.0
    #: "alive", "stopping" (leaving on request), "starting" (sent for it by its launcher) or "failed"
    #: (stopping on a fatal error, ``error``: a launcher that reads it stops the job)
    status: str = "alive"
    epoch: int = 0  #: lineage epoch of the weights the node holds
    weights_digest: str = ""  #: digest of those weights ("" when unknown)
    error: str = ""  #: with status "failed": the cause, one line


@register
@dataclass(frozen=True)
class SnapshotRequest(Message):
    """A node could not reach the newest version by deltas; asks the trainer for a snapshot (on ``control``)."""

    TYPE: ClassVar[str] = "snapshot-request"
    policy: str
    node_id: str
    have_version: int  #: newest version the node holds
    reason: str  #: the subscriber's fault report
    ts: float = 0.0


@register
@dataclass(frozen=True)
class Metric(Message):
    """One measurement, on ``metrics``."""

    TYPE: ClassVar[str] = "metric"
    component: str
    name: str
    value: float
    step: int = 0
    ts: float = 0.0
    labels: dict[str, Any] = field(default_factory=dict)


@register
@dataclass(frozen=True)
class DeadLetter(Message):
    """A record that could not be processed, with where it came from and why.

    Schema 2 bounded it: ``value`` holds at most a prefix of the original (64 KiB), and
    ``value_size`` / ``value_sha256`` name the whole, so a letter fits any producer's limit
    whatever the record it tells of (schema 1 letters carry the whole value; -1, "").
    """

    TYPE: ClassVar[str] = "dead-letter"
    SCHEMA: ClassVar[int] = 2
    source_topic: str
    partition: int
    offset: int
    error_type: str
    error: str
    key: str | None  #: base64 of the original key
    value: str  #: base64 of the original value, or of its first 64 KiB (``truncated``)
    headers: dict[str, str | None] = field(default_factory=dict)  #: original headers (bytes as latin-1; null: null)
    consumer: str = ""  #: who gave up on it
    ts: float = 0.0
    value_size: int = -1  #: bytes of the original value (-1: schema 1, ``value`` is all of it)
    value_sha256: str = ""  #: hex SHA-256 of the original value
    truncated: bool = False  #: value, key or headers were cut to their bounds
