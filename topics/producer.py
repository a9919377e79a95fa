"""The typed producer: idempotent, ``acks=all``, zstd, optionally transactional.

:class:`Producer` encodes typed messages (or sends bytes as they are), and with a
``transactional_id`` runs consume-transform-produce: :meth:`Producer.transaction` and
:meth:`Producer.send_offsets`, which commits a :class:`~.consumer.Consumer`'s offsets inside
the transaction under the group membership the records were handed out in. It bounds every
transactional step (a producer stuck on a coordinator that moved is closed, and a successor
with its id fences it). It knows nothing of how records are read or dead-lettered.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, Iterator

from kafka import TopicPartition
from kafka.errors import (CommitFailedError, IllegalGenerationError, InvalidTransactionTimeoutError, KafkaError,
                          KafkaTimeoutError, RebalanceInProgressError, UnknownMemberIdError)
from kafka.structs import OffsetAndMetadata

from . import security, tracing
from .codec import Headers, encode
from .consumer import Consumer, same_membership
from .exceptions import ProduceError, StaleMembershipError
from .messages import Message
from .registry import RECORD_MAX_BYTES

__all__ = ["Producer", "TRANSACTION_TIMEOUT_MS", "wait"]

log = logging.getLogger(__name__)

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

    def send_offsets(self, consumer: Consumer, offsets: dict[TopicPartition, int] | None = None, *,
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
                if not same_membership(membership, current):
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


