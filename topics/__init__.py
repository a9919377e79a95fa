"""The dataflow layer: Kafka topics, typed messages, producers/consumers, the embedded broker.

Components of a job share nothing but the topics defined here (:class:`JobTopics`).
kafka-python is imported here and nowhere else in the project (a contract in
``pyproject.toml`` says so): callers get :class:`Consumer` methods, :class:`TopicPartition`, :class:`KafkaError` and
the client constructors of :mod:`.security` (with their types, for annotations) instead.
Importing it gives kafka-python's connections larger socket reads (:mod:`.socket_reads`) and
its transactional producer requests that follow a coordinator to its new broker
(:mod:`.txn_recovery`).
"""

from . import socket_reads

socket_reads.install()

from . import txn_recovery

txn_recovery.install()

from .broker import EmbeddedBroker
from .chunking import ChunkReader, ChunkWriter, ReleasableBuffer, write_chunks
from .cluster import EmbeddedCluster
from .codec import decode, encode
from .consumer import Consumer, Delivery, TopicPartition
from .dead_letters import DeadLetters
from .exceptions import (BrokerStartError, ChunkError, CorruptChunkError, DecodeError, InvalidRecord, KafkaError,
                         KafkaRuntimeError, MissingChunkError, ProduceError, StaleMembershipError,
                         TopicConfigMismatch,
                         TopicsError, UnknownMessageType, UnsupportedSchema)
from .messages import (MESSAGE_TYPES, Batch, ChunkManifest, ChunkRef, DeadLetter, GenerationReply,
                       GenerationRequest, Heartbeat, Message,
                       Metric, Prompt, Sample, SnapshotRequest, SourceOffset, Task, TrajectoryGroup,
                       VersionAnnouncement)
from .producer import Producer
from .registry import JobTopics, TopicSpec, ensure_topics, job_topics

__all__ = [
    "EmbeddedBroker", "EmbeddedCluster", "ChunkReader", "ChunkWriter", "ReleasableBuffer", "write_chunks", "Consumer", "DeadLetters", "Delivery",
    "Producer", "TopicPartition",
    "decode", "encode", "BrokerStartError", "ChunkError", "CorruptChunkError", "DecodeError", "InvalidRecord",
    "KafkaError", "KafkaRuntimeError", "MissingChunkError", "ProduceError", "StaleMembershipError", "TopicConfigMismatch", "TopicsError",
    "UnknownMessageType", "UnsupportedSchema", "MESSAGE_TYPES", "Batch", "ChunkManifest", "ChunkRef",
    "DeadLetter", "Heartbeat", "Message", "Metric", "Prompt", "Sample", "SnapshotRequest", "SourceOffset", "Task",
    "TrajectoryGroup", "VersionAnnouncement", "GenerationRequest", "GenerationReply", "JobTopics", "TopicSpec", "ensure_topics", "job_topics",
]
