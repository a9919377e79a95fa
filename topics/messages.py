"""Typed records carried by the job's topics: the data path, and (re-exported) every other.

The data path's records live here: prompts, tasks, trajectory groups and their samples, role
calls (generation requests and replies), batches, group drops and the dataflow's state. The
records of the bookkeeping topics (versions, control, metrics, dead letters) live in
:mod:`.control_messages` and are re-exported here, so ``astraflow.topics.messages`` names
every message type; the base class, the ``af-type`` registry (:data:`MESSAGE_TYPES`) and the
shared field checks are :mod:`.message_base`'s. Encoding lives in :mod:`.codec`; this module
holds only the shapes and what each field means. Lists stay lists (not tuples) because they
are decoded straight from JSON arrays. A message class is a plain dataclass: no ``__init__``
of its own, since decoding fills a record's fields in without calling it (a
``__post_init__`` makes decoding call it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .control_messages import (ChunkManifest, ChunkRef, DeadLetter, Heartbeat, Metric, SnapshotRequest,
                               VersionAnnouncement)
from .message_base import MESSAGE_TYPES, Message, check_sampling, non_negative, register, same_length
from .packed import Flags, Floats, Ints, pack_fields

__all__ = ["MESSAGE_TYPES", "Batch", "ChunkManifest", "ChunkRef", "DROP_REASONS", "DataflowState", "DeadLetter", "GenerationReply",
           "GenerationRequest", "GroupDrop", "Heartbeat", "Message", "Metric", "Prompt", "Sample", "SnapshotRequest",
           "SourceOffset", "Task", "TrajectoryGroup", "VersionAnnouncement", "register"]


@register
@dataclass(frozen=True)
class Prompt(Message):
    """One input problem on the ``prompts`` topic.

    Schema 2 added ``messages`` (a chat model's conversation); a schema-1 record has none.
    """

    TYPE: ClassVar[str] = "prompt"
    SCHEMA: ClassVar[int] = 2
    prompt_id: str
    text: str  #: the prompt as text (engines tokenize it)
    answer: str  #: reference answer used by the reward function
    source: str = ""  #: dataset name / file the prompt came from
    metadata: dict[str, Any] = field(default_factory=dict)
    #: the conversation for a chat model (``{"role", "content"}`` objects; ``text`` is its last
    #: user message); empty: ``text`` is the whole prompt. Rendered with the model's chat
    #: template when the task is made (``Task.prompt_ids``).
    messages: list[dict[str, Any]] = field(default_factory=list)

    def validate(self) -> None:
        for i, m in enumerate(self.messages):
            if type(m) is not dict or type(m.get("role")) is not str:
                raise ValueError(f"messages[{i}] is {m!r:.80}; each message is an object with a string role")


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
    staleness bound was full, as the dataflow's admission then did. Schema 4 added
    ``prompt_ids``: the prompt rendered with the model's chat template when the task was
    made (a schema-3 record has none, and its prompt is tokenized as text).
    """

    TYPE: ClassVar[str] = "task"
    SCHEMA: ClassVar[int] = 4
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
    #: the prompt as the lead policy's model reads it, rendered once with its chat template when
    #: the task was made (:mod:`astraflow.workflows.chat`); empty: workflows tokenize ``prompt``
    prompt_ids: list[int] = field(default_factory=list)

    def validate(self) -> None:
        non_negative("prompt_ids", self.prompt_ids)
        if self.n_samples < 1:
            raise ValueError(f"n_samples is {self.n_samples}; a task asks for at least one sample")
        non_negative("scheduled_version", [self.scheduled_version, *self.scheduled_versions.values()])
        check_sampling(self.sampling)


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
    #: of the context (``prompt_ids`` and the tokens ``loss_mask`` leaves out), how many tokens
    #: a model generated (earlier turns carried as context, :class:`~astraflow.engines.base.PromptRow`):
    #: what an emulated trainer prices as generated tokens; 0 in records before schema 4
    context_generated: int = 0

    __post_init__ = pack_fields

    def validate(self) -> None:
        if self.context_generated < 0:
            raise ValueError(f"context_generated is {self.context_generated}; a count of tokens is >= 0")
        n = len(self.tokens)
        if len(self.logprobs) == n == len(self.versions) and not self.loss_mask and not self.token_roles:
            return  # the common record in one expression (a poll decodes thousands of samples)
        same_length("logprobs", self.logprobs, "tokens", n)
        same_length("versions", self.versions, "tokens", n)
        same_length("loss_mask", self.loss_mask, "tokens", n, may_be_empty=True)
        same_length("token_roles", self.token_roles, "tokens", n, may_be_empty=True)
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
    arrays of earlier records decode to the same packed types. Schema 4 added each sample's
    ``context_generated`` (absent: 0).
    """

    TYPE: ClassVar[str] = "trajectory-group"
    SCHEMA: ClassVar[int] = 4
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

    Schema 3 added ``context_generated``: per row, how many of its prompt tokens a model
    generated (:class:`~astraflow.engines.base.PromptRow`), for an emulated device's prices;
    empty (and in older records): none.
    """

    TYPE: ClassVar[str] = "generation-request"
    SCHEMA: ClassVar[int] = 3
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
    context_generated: list[int] = field(default_factory=list)  #: per row (or none): prompt tokens a model wrote

    def validate(self) -> None:
        check_sampling(self.sampling)
        same_length("seeds", self.seeds, "prompts", len(self.prompts))
        for row in self.prompts:
            non_negative("prompts", row)
        if self.context_generated:
            same_length("context_generated", self.context_generated, "prompts", len(self.prompts))
            for i, (g, row) in enumerate(zip(self.context_generated, self.prompts)):
                if not 0 <= g <= len(row):
                    raise ValueError(f"context_generated[{i}] is {g}; prompts[{i}] has {len(row)} tokens")


@register
@dataclass(frozen=True)
class GenerationReply(Message):
    """The answer to a :class:`GenerationRequest`, on ``replies`` keyed by episode, in the
    request's ``reply_partition``; the record's ``af-request`` header repeats ``request_id``
    so a requester passes over other requesters' replies without decoding them.

    Schema 2 added ``token_versions``: per row, the version of each token when the row went on
    under newer weights (partial rollouts), else empty; absent (schema 1): every row's
    tokens are its ``versions`` entry."""

    TYPE: ClassVar[str] = "generation-reply"
    SCHEMA: ClassVar[int] = 2
    request_id: str
    episode_id: str
    node_id: str
    tokens: list[list[int]]
    logprobs: list[list[float]]
    versions: list[int]  #: per row: the weight version that generated its first token
    finish_reasons: list[str]
    error: str = ""
    ts: float = 0.0
    token_versions: list[list[int]] = field(default_factory=list)  #: per row (or none): each token's version

    def validate(self) -> None:
        n = len(self.tokens)
        same_length("logprobs", self.logprobs, "tokens", n)
        same_length("versions", self.versions, "tokens", n)
        same_length("finish_reasons", self.finish_reasons, "tokens", n)
        if self.token_versions:
            same_length("token_versions", self.token_versions, "tokens", n)
        for i, (row, lp) in enumerate(zip(self.tokens, self.logprobs)):
            same_length(f"logprobs[{i}]", lp, f"tokens[{i}]", len(row))
            non_negative(f"tokens[{i}]", row)
            if self.token_versions and self.token_versions[i]:
                same_length(f"token_versions[{i}]", self.token_versions[i], f"tokens[{i}]", len(row))
                non_negative(f"token_versions[{i}]", self.token_versions[i])


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
        same_length("sources", self.sources, "groups", len(self.groups))
        same_length("replay", self.replay, "groups", len(self.groups), may_be_empty=True)

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
