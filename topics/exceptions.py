"""Errors raised by the dataflow layer.

One base class, :class:`TopicsError` (a branch of :class:`astraflow.errors.AstraflowError`);
every error says what failed and what to do. ``retriable`` tells callers whether trying
again can help.

kafka-python's own errors reach callers as they are (an admin request refused, a broker
not reachable); their base class is re-exported here as :class:`KafkaError` (it has
``retriable`` too), so code outside ``topics/`` catches them without importing kafka-python.
"""

from __future__ import annotations

from kafka.errors import KafkaError

from astraflow.errors import AstraflowError

__all__ = ["BrokerStartError", "ChunkError", "CorruptChunkError", "DecodeError", "InvalidRecord", "KafkaError",
           "KafkaRuntimeError", "MissingChunkError", "ProduceError", "StaleMembershipError", "TopicConfigMismatch",
           "TopicsError", "UnknownMessageType", "UnsupportedSchema"]


class TopicsError(AstraflowError):
    """Base class of every error raised by ``astraflow.topics``."""

    retriable: bool = False


class BrokerStartError(TopicsError):
    """The embedded broker did not come up; the message quotes its log."""


class KafkaRuntimeError(TopicsError):
    """The Kafka jars could not be located or fetched."""


class TopicConfigMismatch(TopicsError):
    """An existing topic's settings differ from what the job requires."""

    def __init__(self, topic: str, key: str, expected: object, actual: object) -> None:
        self.topic, self.key, self.expected, self.actual = topic, key, expected, actual
        super().__init__(
            f"topic {topic!r} exists with {key}={actual!r} but the job requires {key}={expected!r}; "
            f"delete the topic or use another job name"
        )


class DecodeError(TopicsError):
    """A record could not be turned into a typed message (it goes to the DLQ)."""


class InvalidRecord(DecodeError):
    """A record decodes but breaks its schema: a value of the wrong type, or out of its bounds
    (it goes to the DLQ, naming the field)."""


class UnknownMessageType(DecodeError):
    """The ``af-type`` header names no registered message class."""


class UnsupportedSchema(DecodeError):
    """The record's ``af-schema`` is newer than this code understands."""


class ChunkError(TopicsError):
    """A chunked payload could not be reassembled; fetch it again or from a snapshot."""

    retriable = True


class MissingChunkError(ChunkError):
    """A chunk named by the manifest is not on the topic (deleted, or never written)."""


class CorruptChunkError(ChunkError):
    """A chunk's bytes do not match the checksum in the manifest."""


class ProduceError(TopicsError):
    """A record was not acknowledged by the broker."""

    retriable = True


class StaleMembershipError(ProduceError):
    """The consumer lost its group generation between handing records out and committing them.

    Its partitions may already belong to another member, which fetched the old committed
    offsets and redoes those records; committing them here too would answer them twice.
    The transaction is aborted (a plain :meth:`Consumer.commit
    <astraflow.topics.consumer.Consumer.commit>` raises it too, for kafka-python's
    ``CommitFailedError`` and its kin, and forgets the void offsets); the next poll rejoins
    the group and starts again from the committed offsets.
    """
