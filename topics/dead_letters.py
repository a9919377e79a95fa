"""Dead letters: the records a reader could not process, each written once to the job's ``dlq``.

:class:`DeadLetters` is the sink a :class:`~.consumer.Consumer` (or any reader of raw
records) hands a refused record to; :func:`dead_letter` builds the bounded
:class:`~.messages.DeadLetter` of one record. Before its first letter, a sink that may recall
reads back which records its consumer gave up on before (:func:`~.replay.read_headers`), so a
restarted reader passes them over without a second letter. It knows nothing of why a record
was refused: the error comes with it.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Iterable

from .messages import DeadLetter
from .producer import Producer
from .replay import read_headers

__all__ = ["DEAD_LETTER_VALUE_BYTES", "DeadLetters", "dead_letter"]

log = logging.getLogger(__name__)


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
