"""Producer and consumer wrappers that speak typed messages.

:class:`Producer` is idempotent with ``acks=all`` and zstd compression, optionally
transactional (consume-transform-produce with :meth:`Producer.send_offsets`).
:class:`Consumer` commits manually, reads ``read_committed`` and hands back
:class:`Delivery` objects; a record it cannot decode goes to the dead-letter topic with
its coordinates and the consumer moves on, so nothing is dropped silently.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Iterable, Iterator, NamedTuple

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import (CommitFailedError, IllegalGenerationError, InvalidTransactionTimeoutError, KafkaError,
                          KafkaTimeoutError, RebalanceInProgressError, UnknownMemberIdError)
from kafka.structs import MemberState, OffsetAndMetadata

from . import collection, security
from . import tracing
from .codec import Headers, decode, encode
from .exceptions import DecodeError, InvalidRecord, ProduceError, StaleMembershipError
from .messages import DeadLetter, Message, SourceOffset
from .registry import RECORD_MAX_BYTES

log = logging.getLogger(__name__)

MiB = 1024 * 1024
#: Default bound on an open transaction; the job config's ``kafka.transaction_timeout_ms``.
TRANSACTION_TIMEOUT_MS = 30_000


def _key_bytes(key: str | bytes | None) -> bytes | None:
    return key.encode() if isinstance(key, str) else key


class Producer:
    """Typed, idempotent producer.

    Args:
        bootstrap_servers: Kafka bootstrap servers.
        client_id: recorded in the ``af-producer`` header of every record.
        transactional_id: enables transactions (then use :meth:`transaction`).
        transaction_timeout_ms: how long a transaction may stay open; if this producer
            dies inside one, ``read_committed`` readers of its partitions wait this long
            (plus the broker's abort sweep) before the broker aborts it. kafka-python's
            default of 60 s would stall a job's consumers twice as long.
        max_request_size: bytes; the ``max.message.bytes`` of the topics it writes
            (:meth:`~.registry.JobTopics.max_message_bytes`; every topic's but batches' is
            :data:`~.registry.RECORD_MAX_BYTES`). Chunked payloads are <= 1 MiB plus headers.
        **config: further ``KafkaProducer`` settings.
    """

    def __init__(self, bootstrap_servers: str, *, client_id: str = "astraflow",
                 transactional_id: str | None = None, transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS,
                 max_request_size: int = RECORD_MAX_BYTES, linger_ms: int = 5, **config: Any) -> None:
        self.client_id = client_id
        settings: dict[str, Any] = dict(
            bootstrap_servers=bootstrap_servers, client_id=client_id, acks="all",
            enable_idempotence=True, compression_type="zstd", linger_ms=linger_ms,
            max_request_size=max_request_size, batch_size=256 * 1024,
        )
        if transactional_id:
            settings.update(transactional_id=transactional_id, transaction_timeout_ms=transaction_timeout_ms)
        settings.update(config)
        self._kp = security.producer(**settings)
        self._stuck = False
        self.transactional = bool(transactional_id)
        if self.transactional:
            try:
                self._kp.init_transactions()
            except KafkaError as e:
                # kafka-python wraps the broker's INVALID_TRANSACTION_TIMEOUT in a plain KafkaError.
                if not isinstance(e, InvalidTransactionTimeoutError) and "InvalidTransactionTimeout" not in str(e):
                    raise
                self._kp.close(timeout=0)
                raise ProduceError(
                    f"producer {transactional_id}: transaction timeout {transaction_timeout_ms} ms is above the "
                    f"broker's transaction.max.timeout.ms; lower kafka.transaction_timeout_ms") from e

    # -- sending ---------------------------------------------------------------------
    def send(self, topic: str, msg: Message, key: str | bytes | None = None, *,
             partition: int | None = None, headers: Headers | None = None, trace: bool = True,
             sign: Callable[[str, bytes], Headers] | None = None):
        """Send a typed message; returns the kafka-python future (``.get()`` for metadata).
        ``sign(topic, value)``, when given, adds the headers that sign the exact value bytes
        written (a signer's ``headers``), so the message is encoded once."""
        value, hdrs = encode(msg, self.client_id)
        if headers:
            hdrs.extend(headers)
        if sign is not None:
            hdrs.extend(sign(topic, value))
        if trace:
            tracing.inject(hdrs)
        return self._kp.send(topic, value=value, key=_key_bytes(key), headers=hdrs, partition=partition)

    def send_raw(self, topic: str, value: bytes | None, key: str | bytes | None = None, *,
                 partition: int | None = None, headers: Headers | None = None):
        """Send bytes as they are (weight chunks, dead letters' originals, tests)."""
        return self._kp.send(topic, value=value, key=_key_bytes(key), headers=list(headers or []),
                             partition=partition)

    def send_sync(self, topic: str, msg: Message, key: str | bytes | None = None,
                  timeout: float = 30.0, **kw: Any):
        """Send and wait for the broker's acknowledgement; raises :class:`ProduceError`."""
        return wait(self.send(topic, msg, key, **kw), timeout, topic)

    def flush(self, timeout: float | None = None) -> None:
        self._kp.flush(timeout)

    @property
    def network_thread_id(self) -> int | None:
        """The OS thread id of the client's I/O thread (it sends every batch), None if unknown."""
        sender = getattr(self._kp, "_sender", None)  # kafka-python's network thread
        return getattr(sender, "native_id", None)

    # -- transactions ----------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator["Producer"]:
        """Begin a transaction; commit on normal exit, abort on an exception."""
        if not self.transactional:
            raise RuntimeError("producer was created without transactional_id")
        self._kp.begin_transaction()
        try:
            yield self
        except BaseException:
            if self._stuck:  # closed: nothing to abort here, the next owner of the id aborts it
                raise
            try:
                self._await(self._kp._transaction_manager.begin_abort(), "abort")
            except Exception as abort_error:  # noqa: BLE001 - the original error is the one to report
                log.warning("aborting the transaction of %s failed too: %s", self.client_id, abort_error)
            raise
        self._await(self._kp._transaction_manager.begin_commit(), "commit")

    def send_offsets(self, consumer: "Consumer", offsets: dict[TopicPartition, int] | None = None, *,
                     membership: Any = None) -> None:
        """Commit ``consumer``'s processed offsets inside the current transaction.

        ``membership``: the group membership ``offsets`` were handed out in (a node with several
        polls in flight keeps each poll's, :meth:`Consumer.membership_for` at that poll): they are
        committed under it, and only if it is still the consumer's current one (else
        :class:`StaleMembershipError`, as for the default)."""
        offs = offsets if offsets is not None else consumer.pending_offsets()
        if offs:
            # Consume-process-produce (no explicit offsets): commit under the membership the
            # records were handed out in, checked still current. The broker fences a stale
            # generation but accepts a transactional commit that names none, and kafka-python
            # resets to generation -1 when it learns it was kicked out. Explicit offsets are a
            # single-member group's own bookkeeping (the dataflow; its transactional id fences
            # an older instance): they go under the current membership.
            if membership is not None:
                current = consumer.group_metadata()
                if not _same_membership(membership, current):
                    raise StaleMembershipError(
                        f"producer {self.client_id}: the records of these offsets were handed out in generation "
                        f"{membership.generation_id}, the consumer is now in {current.generation_id}; not "
                        f"committing them — the partition's owner redoes them from the committed offset")
            elif offsets is None:
                membership = consumer.membership_for(offs)
            else:
                membership = consumer.group_metadata()
            try:
                self._await(self._kp._transaction_manager.send_offsets_to_transaction(
                    {tp: OffsetAndMetadata(o, "", -1) for tp, o in offs.items()}, membership),
                    "offset commit")
            except (CommitFailedError, RebalanceInProgressError, IllegalGenerationError, UnknownMemberIdError) as e:
                # The broker knew better than the client: the member was expelled or the group
                # moved on since the poll (e.g. a session that expired while the coordinator
                # moved to another broker). Another member redoes these records; the caller's
                # transaction is aborted (the same fencing as a stale membership seen here).
                # The consumer forgets its generation so its next poll rejoins.
                meta = consumer.group_metadata()
                consumer.membership_refused()
                raise StaleMembershipError(
                    f"producer {self.client_id}: the group coordinator of {meta.group_id} refused the offsets "
                    f"{sorted((tp.topic, tp.partition, o) for tp, o in offs.items())} under generation "
                    f"{membership.generation_id}, member {membership.member_id!r} ({type(e).__name__}: {e}); "
                    f"not committed — the partition's owner redoes them from the committed offset") from e
            consumer.mark_committed(offs)

    def _await(self, result, what: str) -> None:
        """Wait for a transactional step, at most ``max_block_ms``.

        What kafka-python's ``commit_transaction``/``send_offsets_to_transaction`` do, with
        a bound: when a coordinator's broker dies at the wrong moment, kafka-python 3.0
        can drop the pending request and never answer it. A producer stuck like that is
        closed; a new one with the same transactional id fences it and aborts its
        transaction, so the caller (an actor, restarted by its supervisor) loses nothing.
        """
        self._kp._sender.wakeup()
        timeout_ms = self._kp.config["max_block_ms"]
        if not result.wait(timeout_ms=timeout_ms):
            self._abandon()
            raise ProduceError(f"producer {self.client_id}: transaction {what} not answered within "
                               f"{timeout_ms / 1000:.0f}s (a Kafka coordinator moved?); producer closed, "
                               f"a new one with its transactional id takes over")

    def close(self, timeout: float | None = 10.0) -> None:
        try:
            self._kp.close(timeout=timeout)
        except KafkaTimeoutError:
            # kafka-python's close raises from its flush when records are still unsent at the
            # deadline, before it stops its sender thread: stop it and fail those records.
            self._abandon()

    def _abandon(self) -> None:
        """Close a producer whose transaction will never finish: stop its sender thread and
        fail its unsent records (a successor with the same transactional id fences it and
        aborts that transaction), so closing neither waits on them nor leaks the thread."""
        self._stuck = True
        self._kp._sender.force_close()
        self._kp._accumulator.abort_incomplete_batches()
        self._kp.close(timeout=0)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait(future, timeout: float, topic: str = ""):
    """Resolve a send future; kafka-python reports oversized records only here."""
    try:
        return future.get(timeout=timeout)
    except Exception as e:  # noqa: BLE001 - kafka-python raises many KafkaError subclasses
        raise ProduceError(f"record to {topic or 'topic'} not acknowledged: {type(e).__name__}: {e}") from e


def _same_membership(a: Any, b: Any) -> bool:
    return (a.generation_id, a.member_id) == (b.generation_id, b.member_id) and a.generation_id >= 0


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


#: The most of an original record's value a dead letter carries (its size and SHA-256 name
#: the whole): a letter must fit its producer's limit whatever the record's size, or the
#: consumer that gives up on a record too big to retell could not give up on it at all.
DEAD_LETTER_VALUE_BYTES = 64 * 1024
#: The most of its key and of each header value (and the headers it keeps), for the same reason.
DEAD_LETTER_FIELD_BYTES = 1024
DEAD_LETTER_HEADERS = 32
DEAD_LETTER_ERROR_CHARS = 4096
#: Record headers of a dead letter: where its record came from, and who gave up on it, so a
#: restarted consumer finds the records it already dead-lettered without decoding letters.
H_SOURCE = "af-source"
H_CONSUMER = "af-consumer"


class DeadLetters:
    """Writes records that could not be processed to the job's ``dlq`` topic, each once.

    A letter keeps the record's coordinates, why it was refused, its size, its SHA-256 and
    at most :data:`DEAD_LETTER_VALUE_BYTES` of its value (``truncated`` says whether that
    is all of it). With ``recall`` (the bootstrap servers), the first letter this object
    writes is preceded by reading back which records ``consumer_name`` dead-lettered
    before (the ``af-source`` headers of the topic): a consumer restarted from offsets
    behind a record it already gave up on (a trainer resuming at its checkpoint, a
    reader that starts from the beginning) passes it over again without a second letter.
    """

    def __init__(self, producer: Producer, topic: str, consumer_name: str = "", *,
                 recall: str | None = None) -> None:
        self.producer, self.topic, self.consumer_name = producer, topic, consumer_name
        self.count = 0  #: letters written by this object
        self.repeats = 0  #: records refused again that already had a letter (not written twice)
        self._recall = recall
        self._given_up: set[tuple[str, int, int]] | None = None if recall else set()
        self._make: Callable[[], Producer] | None = None
        self._lock = threading.Lock()  # one node's readers (tasks, replies, versions) share one

    @classmethod
    def own(cls, bootstrap_servers: str, topic: str, consumer_name: str) -> "DeadLetters":
        """Letters for a reader that writes nothing else (the launcher, the autoscaler): their
        producer is made at the first letter, so a run without poison opens no extra
        client; :meth:`close` closes it. Recalls what ``consumer_name`` dead-lettered before."""
        letters = cls(None, topic, consumer_name, recall=bootstrap_servers)  # type: ignore[arg-type]
        letters._make = lambda: Producer(bootstrap_servers, client_id=f"{consumer_name}.dlq")
        return letters

    def close(self) -> None:
        """Close the producer :meth:`own` made (a producer given to the constructor is the caller's)."""
        if self._make is not None and self.producer is not None:
            self.producer.close()
            self.producer = None

    def put(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
            headers: Iterable[tuple[str, bytes]] | None, error: Exception) -> DeadLetter | None:
        """Write the letter of one record (durably, before the consumer may commit past it);
        None when this consumer dead-lettered that record before."""
        with self._lock:
            return self._put(topic, partition, offset, key, value, headers, error)

    def _put(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
             headers: Iterable[tuple[str, bytes]] | None, error: Exception) -> DeadLetter | None:
        if self._given_up is None:
            self._given_up = self._read_given_up()
        where = (topic, partition, offset)
        if where in self._given_up:
            self.repeats += 1
            log.warning("%s[%d]@%d was dead-lettered before: passed over again (%s)", topic, partition, offset, error)
            return None
        letter = dead_letter(topic, partition, offset, key, value, headers, error, self.consumer_name)
        if self.producer is None and self._make is not None:
            self.producer = self._make()
        source = f"{topic}/{partition}/{offset}".encode()
        self.producer.send_sync(self.topic, letter, key=topic, trace=False,
                                headers=[(H_SOURCE, source), (H_CONSUMER, self.consumer_name.encode())])
        self._given_up.add(where)
        self.count += 1
        log.warning("dead-lettered %s[%d]@%d: %s", topic, partition, offset, error)
        return letter

    def _read_given_up(self) -> set[tuple[str, int, int]]:
        """The coordinates of every record ``consumer_name`` dead-lettered on ``topic`` so far."""
        out: set[tuple[str, int, int]] = set()
        try:
            for source, consumer in read_headers(self._recall, self.topic, (H_SOURCE, H_CONSUMER)):
                if consumer == self.consumer_name.encode() and source:
                    t, p, o = source.decode("utf-8", "replace").rsplit("/", 2)
                    out.add((t, int(p), int(o)))
        except Exception as e:  # noqa: BLE001 - at worst a record gets a second letter
            log.warning("could not read back the dead letters of %s on %s (%s: %s); a record dead-lettered "
                        "before may get a second letter", self.consumer_name, self.topic, type(e).__name__, e)
        return out


def dead_letter(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                headers: Iterable[tuple[str, bytes]] | None, error: Exception, consumer: str = "") -> DeadLetter:
    """The letter of one record, bounded whatever the record's size (see :data:`DEAD_LETTER_VALUE_BYTES`)."""
    value = value or b""
    kept = list(headers or ())[:DEAD_LETTER_HEADERS]
    return DeadLetter(
        source_topic=topic, partition=partition, offset=offset,
        error_type=type(error).__name__, error=str(error)[:DEAD_LETTER_ERROR_CHARS],
        key=base64.b64encode(key[:DEAD_LETTER_FIELD_BYTES]).decode() if key is not None else None,
        value=base64.b64encode(value[:DEAD_LETTER_VALUE_BYTES]).decode(),
        headers={k[:DEAD_LETTER_FIELD_BYTES]: v[:DEAD_LETTER_FIELD_BYTES].decode("latin-1") if v is not None else None
                 for k, v in kept},
        consumer=consumer, ts=time.time(), value_size=len(value), value_sha256=hashlib.sha256(value).hexdigest(),
        truncated=len(value) > DEAD_LETTER_VALUE_BYTES or (key is not None and len(key) > DEAD_LETTER_FIELD_BYTES)
        or len(kept) < len(list(headers or ())))


def read_headers(bootstrap_servers: str, topic: str, names: tuple[str, ...], timeout_s: float = 30.0) -> list[tuple]:
    """For every record now on ``topic`` (all partitions, from the beginning): the values of
    its headers ``names`` (None where it has none); no value is decoded."""
    kc = security.consumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
                           client_id="astraflow-headers", isolation_level="read_committed")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(kc.partitions_for_topic(topic) or [])]
        kc.assign(tps)
        kc.seek_to_beginning(*tps)
        ends = kc.end_offsets(tps)
        out: list[tuple] = []
        deadline = time.monotonic() + timeout_s
        while any(kc.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"reading {topic} to its end took over {timeout_s:.0f}s")
            for records in kc.poll(timeout_ms=500).values():
                for r in records:
                    hs = dict(reversed(r.headers or []))  # the first of a name counts
                    out.append(tuple(hs.get(n) for n in names))
        return out
    finally:
        kc.close()


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
    state the records before it left. ``pending_offsets()`` are the positions after every record handed out (and every
    record dead-lettered) since the last commit; :meth:`commit` commits them, or a
    transactional producer commits them with :meth:`Producer.send_offsets`.
    """

    def __init__(self, bootstrap_servers: str, *, topics: Iterable[str] = (),
                 partitions: Iterable[TopicPartition] = (), group_id: str | None = None,
                 dead_letters: DeadLetters | None = None, isolation_level: str = "read_committed",
                 auto_offset_reset: str = "earliest", client_id: str = "astraflow",
                 max_partition_fetch_bytes: int = 4 * MiB,
                 expect: tuple[type[Message], ...] | Mapping[str, tuple[type[Message], ...]] = (),
                 accept: Callable[[bytes | None, list[tuple[str, bytes]]], bool] | None = None,
                 validate: Callable[["Delivery"], None] | None = None,
                 redo_lost: bool = False,
                 **config: Any) -> None:
        settings: dict[str, Any] = dict(
            bootstrap_servers=bootstrap_servers, group_id=group_id, client_id=client_id,
            enable_auto_commit=False, isolation_level=isolation_level,
            auto_offset_reset=auto_offset_reset,
            max_partition_fetch_bytes=max_partition_fetch_bytes,
            fetch_max_bytes=max(max_partition_fetch_bytes, 50 * MiB),
        )
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
        """The underlying kafka-python consumer (seek, positions, assignment)."""
        return self._kc

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
                void = [tp for tp, m in self._handed_out_in.items() if not _same_membership(m, membership)]
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
                or not _same_membership(fetched.pop(), current)):
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
