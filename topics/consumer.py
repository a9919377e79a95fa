"""The typed consumer: manual commits, ``read_committed``, records handed out as :class:`Delivery`.

:class:`Consumer` owns one kafka-python consumer and everything callers do with it: polling
(decoding with the garbage collector paused), commits checked against the group membership
the records were handed out in, redoing the records of a lost membership, and the positions
a reader moves by hand (:meth:`Consumer.seek`, :meth:`Consumer.seek_to_end`,
:meth:`Consumer.end_offsets`, ...). A record it cannot decode goes to the dead-letter sink it
was given (:class:`~.dead_letters.DeadLetters`) with its coordinates, and the consumer moves
on, so nothing is dropped silently. It knows nothing of producers or transactions; a
transactional producer commits its offsets (:meth:`.producer.Producer.send_offsets`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Iterable, NamedTuple, Protocol

from kafka import KafkaConsumer, TopicPartition
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from kafka.errors import CommitFailedError, IllegalGenerationError, RebalanceInProgressError, UnknownMemberIdError
from kafka.structs import MemberState, OffsetAndMetadata

from . import collection, security, tracing
from .codec import decode
from .exceptions import DecodeError, InvalidRecord, StaleMembershipError
from .messages import Message, SourceOffset

__all__ = ["Consumer", "DeadLetterSink", "Delivery", "TopicPartition", "same_membership"]

MiB = 1024 * 1024


class Delivery(NamedTuple):
    """A decoded record and where it came from (a named tuple: one is made per record)."""

    topic: str
    partition: int
    offset: int
    key: str | None  #: the record's key as text (undecodable bytes replaced)
    message: Message
    headers: list[tuple[str, bytes]]  #: as kafka-python read them (a value may be None)
    timestamp_ms: int

    @property
    def source(self) -> SourceOffset:
        return SourceOffset(self.topic, self.partition, self.offset)

    @property
    def trace_context(self):
        return tracing.extract(self.headers)


_tuple_new = tuple.__new__  #: a Delivery without its generated __new__'s Python frame (one per record)


class DeadLetterSink(Protocol):
    """Where a consumer sends the records it refuses (:class:`~.dead_letters.DeadLetters`)."""

    def put(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
            headers: Iterable[tuple[str, bytes]] | None, error: Exception) -> object: ...


def same_membership(a: Any, b: Any) -> bool:
    """Whether two group memberships (kafka-python's group metadata) are one generation of one member."""
    return (a.generation_id, a.member_id) == (b.generation_id, b.member_id) and a.generation_id >= 0


class Consumer:
    """Typed consumer with manual commits.

    Either ``topics`` (group subscription) or ``partitions`` (manual assignment).
    With ``expect`` (message types, or per topic a mapping of topic to types), a record of
    any other message type is dead-lettered like an undecodable one. With ``accept``
    (``accept(key, headers) -> bool``), a record it refuses is passed over before its value
    is decoded (a reader of a shared topic that wants only its own records). With
    ``validate`` (``validate(delivery)``, raising :class:`~.exceptions.InvalidRecord` or
    ``ValueError``), a decoded record the reader's own knowledge refuses (a token beyond its
    model's vocabulary, a step it already trained) is dead-lettered like an undecodable one,
    as it is handed out: a reader that takes one record per poll judges each against the
    state the records before it left. With ``sticky``, a group member keeps its partitions
    across rebalances where it can (kafka-python's sticky assignor), so a rebalance moves as
    little work as possible. ``pending_offsets()`` are the positions after every record
    handed out (and every record dead-lettered) since the last commit; :meth:`commit`
    commits them, or a transactional producer commits them with
    :meth:`~.producer.Producer.send_offsets`.
    """

    def __init__(self, bootstrap_servers: str, *, topics: Iterable[str] = (),
                 partitions: Iterable[TopicPartition] = (), group_id: str | None = None,
                 dead_letters: DeadLetterSink | None = None, isolation_level: str = "read_committed",
                 auto_offset_reset: str = "earliest", client_id: str = "astraflow",
                 max_partition_fetch_bytes: int = 4 * MiB,
                 expect: tuple[type[Message], ...] | Mapping[str, tuple[type[Message], ...]] = (),
                 accept: Callable[[bytes | None, list[tuple[str, bytes]]], bool] | None = None,
                 validate: Callable[["Delivery"], None] | None = None,
                 redo_lost: bool = False, sticky: bool = False,
                 **config: Any) -> None:
        settings: dict[str, Any] = dict(
            bootstrap_servers=bootstrap_servers, group_id=group_id, client_id=client_id,
            enable_auto_commit=False, isolation_level=isolation_level,
            auto_offset_reset=auto_offset_reset,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            fetch_max_bytes=max(max_partition_fetch_bytes, 50 * MiB),
        )
        if sticky:
            settings["partition_assignment_strategy"] = [StickyPartitionAssignor]
        settings.update(config)
        self._kc = security.consumer(**settings)
        topics, partitions = list(topics), list(partitions)
        if topics:
            # Know every topic's partitions before the first join: a join without them assigns
            # nothing, and in the rejoin that follows kafka-python 3.0 has been seen to end up
            # with no assignment at all (the dataflow's prompt consumer, topics just created).
            for topic in topics:
                self._kc.partitions_for_topic(topic)
            self._kc.subscribe(topics)
        elif partitions:
            self._kc.assign(partitions)
        self.dead_letters = dead_letters
        self.expect = expect
        self.accept = accept
        self.validate = validate
        self.skipped = 0  #: records ``accept`` passed over undecoded
        #: a group member whose records are work handed out to it (tasks, generate requests): when
        #: its membership is lost it is handed its uncommitted records again if it keeps their
        #: partitions (:meth:`_redo`); a reader that holds records across polls on purpose and
        #: commits offsets it computes itself (the dataflow) keeps its position
        self.redo_lost = redo_lost
        self.redone = 0  #: partitions moved back to their committed offset after a membership was lost
        self._subscribed = bool(topics) and group_id is not None
        self._pending: dict[TopicPartition, int] = {}
        self._handed_out_in: dict[TopicPartition, Any] = {}  # partition -> group membership at poll
        self._outside_since: float | None = time.monotonic()  # not a group member yet
        self._last_poll_records = 0  # records the last poll fetched (:meth:`poll`'s collector sweep)

    @property
    def raw(self) -> KafkaConsumer:
        """The underlying kafka-python consumer, for tests that probe its internals (its group
        coordinator). Code outside ``topics/`` uses the methods below
        (``tests/topics/test_kafka_boundary.py`` fails on a ``.raw.`` there)."""
        return self._kc

    # -- positions a reader moves by hand --------------------------------------------------
    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on, from the next poll."""
        self._kc.seek(partition, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Read ``partitions`` (default: every assigned one) from their first record kept."""
        self._kc.seek_to_beginning(*partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Read ``partitions`` (default: every assigned one) from their end as of now, so only
        what is written after this call is handed out (the end is resolved here, not at the
        next poll)."""
        tps = list(partitions) or list(self._kc.assignment())
        for tp, end in self.end_offsets(tps).items():
            self._kc.seek(tp, end)

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record of ``partition`` this consumer would fetch."""
        return self._kc.position(partition)

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The end offset of each of ``partitions`` (past the last record readable at this
        consumer's isolation level)."""
        return self._kc.end_offsets(list(partitions))

    def partitions_of(self, topic: str) -> list[TopicPartition]:
        """Every partition of ``topic``, in order (none for a topic the cluster does not know)."""
        return [TopicPartition(topic, p) for p in sorted(self._kc.partitions_for_topic(topic) or ())]

    def committed(self, partition: TopicPartition) -> int | None:
        """The offset this consumer's group committed for ``partition`` (None: none yet)."""
        return self._kc.committed(partition)

    def hold(self, hold: bool) -> None:
        """Pause every assigned partition (``True``) or resume the paused ones. A held consumer
        still polls, which keeps its group membership current (a rebalance waits for every
        member's poll), but hands out nothing from the partitions it held; one assigned since
        is not held until the next call."""
        kc = self._kc
        if hold:
            kc.pause(*[tp for tp in kc.assignment() if tp not in kc.paused()])
        elif kc.paused():
            kc.resume(*kc.paused())

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[Delivery]:
        """Decoded records, in partition order; undecodable ones are dead-lettered and skipped.

        Records already fetched are parsed and decoded with the garbage collector paused, and
        a large batch skips its young generations (:mod:`.collection`); waiting for more and
        writing dead letters are not paused.
        """
        paused, promote = collection.pause(), False
        try:
            # A reader of large batches (the last poll's size predicts this one's) sweeps the young
            # generations before the fetch is parsed, while they hold only what the poll found.
            swept = collection.sweep(paused, self._last_poll_records)
            batches = self._kc.poll(timeout_ms=0, max_records=max_records)  # what is already fetched
            if not batches and timeout_ms > 0:
                collection.resume(paused)  # wait with the collector running
                paused = False
                batches = self._kc.poll(timeout_ms=timeout_ms, max_records=max_records)
                paused, swept = collection.pause(), False  # younger objects than the sweep now
            membership = self._kc.group_metadata() if self._subscribed else None
            if membership is not None:
                # Records handed out under an older generation are void: they are redone from
                # the committed offset, by whichever member holds the partition now.
                void = [tp for tp, m in self._handed_out_in.items() if not same_membership(m, membership)]
                if void:
                    batches = self._redo(void, batches)
            records = self._last_poll_records = sum(map(len, batches.values()))
            promote = records >= collection.PROMOTE_MIN_RECORDS and (swept or collection.sweep(paused, records))
            out, rejected = self._decode(batches)
        finally:
            collection.resume(paused, promote)
        if membership is not None:
            if membership.generation_id >= 0 and membership.member_id and membership.state == MemberState.STABLE:
                self._outside_since = None
            elif self._outside_since is None:
                self._outside_since = time.monotonic()
        for tp, records in batches.items():
            if not records:
                continue
            if membership is not None:
                self._handed_out_in[tp] = membership
            if rejected:
                self._reject(tp, records, rejected)
            self._pending[tp] = records[-1].offset + 1
        return out

    def _decode(self, batches: Mapping[TopicPartition, list]) -> tuple[list[Delivery], dict[int, DecodeError]]:
        """The deliveries of ``batches``, and by record id why each of the others is none."""
        out: list[Delivery] = []
        rejected: dict[int, DecodeError] = {}
        expect, accept, validate = self.expect, self.accept, self.validate
        for tp, records in batches.items():
            allowed = expect.get(tp.topic, ()) if isinstance(expect, Mapping) else expect
            for r in records:
                headers = r.headers or []  # kafka-python's own list, one per record
                if accept is not None and not accept(r.key, headers):
                    self.skipped += 1  # not this reader's: never decoded, its offset still counts (poll)
                    continue
                try:
                    msg = decode(r.value, headers)
                    if allowed and not isinstance(msg, allowed):
                        raise DecodeError(f"{r.topic} carries {', '.join(t.TYPE for t in allowed)} records, "
                                          f"not {msg.TYPE}")
                    key = r.key.decode("utf-8", "replace") if r.key is not None else None
                    delivery = _tuple_new(Delivery, (r.topic, r.partition, r.offset, key, msg, headers, r.timestamp))
                    if validate is not None:
                        try:
                            validate(delivery)
                        except ValueError as e:
                            raise InvalidRecord(str(e)) from None
                except DecodeError as e:
                    rejected[id(r)] = e
                else:
                    out.append(delivery)
        return out, rejected

    def _reject(self, tp: TopicPartition, records: list, rejected: dict[int, DecodeError]) -> None:
        """Dead-letter ``records`` that are in ``rejected``, in order; without a dead-letter
        topic, raise the first one's error (the records before it count as handed out)."""
        for r in records:
            error = rejected.get(id(r))
            if error is not None:
                if self.dead_letters is None:
                    raise error
                self.dead_letters.put(r.topic, r.partition, r.offset, r.key, r.value, r.headers or [], error)
            self._pending[tp] = r.offset + 1

    def _redo(self, void: Iterable[TopicPartition], batches: Mapping[TopicPartition, list] | None = None) -> dict:
        """Forget the pending offsets of ``void`` partitions (handed out, never committed, under a
        membership that is gone); with ``redo_lost``, also move each one this consumer still
        holds back to its committed offset: kafka-python keeps a partition's fetch position
        across a rebalance that leaves it with the same member, so without this the member would
        go on past records nobody will ever answer (the job stalls with them uncommitted).
        Records of those partitions in ``batches`` (fetched from the old position) are dropped;
        they come again."""
        batches = dict(batches or {})
        assigned = self._kc.assignment() if self.redo_lost else set()
        for tp in void:
            self._pending.pop(tp, None)
            self._handed_out_in.pop(tp, None)
            if tp not in assigned:
                continue  # its new owner starts from the committed offset
            committed = self._kc.committed(tp)
            if committed is None or committed < 0:
                self._kc._subscription.request_offset_reset(tp)  # none yet: the reset policy's start
            else:
                self._kc.seek(tp, committed)
            batches.pop(tp, None)
            self.redone += 1
        return batches

    def _lost(self, offsets: dict[TopicPartition, int]) -> None:
        """A commit of ``offsets`` was refused: forget them; with ``redo_lost``, hand them out again."""
        if self.redo_lost:
            self._redo(offsets)
        else:
            self._forget(offsets)

    def pending_offsets(self) -> dict[TopicPartition, int]:
        return dict(self._pending)

    def mark_committed(self, offsets: dict[TopicPartition, int]) -> None:
        self._forget(offsets)

    def _forget(self, offsets: dict[TopicPartition, int]) -> None:
        """Drop pending offsets: committed, or void (another member redoes their records)."""
        for tp, off in offsets.items():
            if self._pending.get(tp) == off:
                del self._pending[tp]
                self._handed_out_in.pop(tp, None)

    def membership_for(self, offsets: dict[TopicPartition, int]):
        """The group membership to commit ``offsets`` under inside a transaction (KIP-447).

        For a subscribed consumer: the generation its records were handed out in, provided the
        consumer is still a member of exactly that generation; otherwise
        :class:`StaleMembershipError` (another member may be redoing those records).
        """
        current = self._kc.group_metadata()
        if not self._subscribed:
            return current
        fetched = {self._handed_out_in.get(tp) for tp in offsets}
        if (len(fetched) != 1 or None in fetched or current.generation_id < 0 or not current.member_id
                or not same_membership(fetched.pop(), current)):
            raise StaleMembershipError(
                f"consumer {self._kc.config['client_id']} of group {current.group_id}: its membership changed "
                f"since the records at {sorted((tp.topic, tp.partition, o) for tp, o in offsets.items())} were "
                f"handed out (now generation {current.generation_id}, member {current.member_id!r}); not committing "
                f"them — the partition's owner redoes them from the committed offset")
        return current

    def membership_refused(self) -> None:
        """The group coordinator refused this member's generation (it rejected a transactional
        offset commit made under it): forget the generation, as kafka-python does when its own
        commit or heartbeat is refused, so the next poll rejoins the group. A client that still
        says "stable" would otherwise go on handing out records under a membership the broker
        no longer has, and every transaction of them would be refused in turn."""
        if self._subscribed:
            self._kc._coordinator.reset_generation()

    def commit(self, offsets: dict[TopicPartition, int] | None = None, *,
               check_membership: bool | None = None) -> None:
        """Synchronously commit ``offsets`` (default: everything handed out so far).

        ``check_membership`` (default: only when ``offsets`` is not given) first checks that
        the records were handed out under the membership still current, as below; a caller
        committing part of what it was handed (a prefix) asks for it.

        A subscribed consumer that lost its group membership since it handed the records out
        (a rebalance: kicked out for a slow poll, a session that expired, a broker restart)
        raises :class:`StaleMembershipError`, as the transactional path does, instead of
        kafka-python's ``CommitFailedError`` / ``RebalanceInProgressError``: the partition's
        owner after the rebalance is handed the same records from the committed offset, so
        the caller drops what it did for them (nothing is lost; they are redone once). The
        void offsets are forgotten here, so the next commit does not try them again.
        """
        explicit = offsets is not None
        check = (not explicit) if check_membership is None else check_membership
        offs = offsets if explicit else self.pending_offsets()
        if not offs:
            return
        try:
            if self._subscribed and check:
                self.membership_for(offs)  # handed out under the membership still current
            self._kc.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offs.items()})
        except StaleMembershipError:
            self._lost(offs)
            raise
        except (CommitFailedError, RebalanceInProgressError, IllegalGenerationError, UnknownMemberIdError) as e:
            if not self._subscribed:
                raise
            self._lost(offs)
            # kafka-python refuses a commit itself while it says "rebalancing", and its poll rejoins
            # only when a rejoin is pending; a client left rebalancing with none pending (seen in CI)
            # would refuse every commit and hand the same records out again forever. Ask for one:
            # a no-op when a join is already pending or in flight (the next poll completes it).
            self._kc._coordinator.request_rejoin()
            meta = self._kc.group_metadata()
            raise StaleMembershipError(
                f"consumer {self._kc.config['client_id']} of group {meta.group_id}: the group rebalanced before "
                f"the offsets {sorted((tp.topic, tp.partition, o) for tp, o in offs.items())} were committed "
                f"({type(e).__name__}: {e}); not committed — the partition's owner redoes them from the "
                f"committed offset") from e
        self.mark_committed(offs)

    def group_metadata(self):
        return self._kc.group_metadata()

    def seconds_outside_group(self) -> float:
        """For a subscribed consumer: how long, as of its last :meth:`poll`, it has not been a
        stable member of its group — never joined, left, or in a rebalance (counted from its
        creation if it never joined); 0 while it is one.

        Long unsettled is suspicious, not proof (a rebalance waits for the slowest member):
        :class:`~astraflow.topics.membership.MembershipWatch` asks the broker before anyone
        recreates the consumer.
        """
        if not self._subscribed or self._outside_since is None:
            return 0.0
        return time.monotonic() - self._outside_since

    def assignment(self) -> set[TopicPartition]:
        return self._kc.assignment()

    def close(self, autocommit: bool = False) -> None:
        self._kc.close(autocommit=autocommit)

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
