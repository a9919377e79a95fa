"""Chunks of weight payloads read while they are written, before their version is announced.

A version is announced only once every chunk of its payload is durable, so a subscriber
that fetched only after the announcement would add the whole read to the whole write.
:class:`ChunkPrefetcher` tails ``weights.<policy>`` from the moment it starts and keeps the
chunks of recent payloads in memory, with the BLAKE3 digest of the bytes it holds; when
the announcement comes, :class:`~astraflow.topics.ChunkReader` takes those chunks from
here (checked against the announced manifest exactly like fetched ones: offset, object,
size, digest) and fetches only what is missing.

Nothing here is trusted: a chunk is only ever *offered* to the reader, under the offset
the manifest names. What the prefetcher saw but no manifest asks for is dropped: payloads
older than one a reader took, and the oldest ones when ``max_bytes`` is exceeded. A node
that follows every version takes every delta; snapshot chunks are kept only while the
owner says it needs one (a node that holds no weights yet), since a follower never reads
them (Kafka still sends them to this consumer: a follower's extra read is one snapshot
every ``snapshot_every`` versions, discarded after the record check).

It reads chunks and their record headers only: it does not decode payloads (that is
:mod:`.codec`) or follow announcements (its owner, :mod:`.subscriber`, does).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping

from blake3 import blake3

from astraflow.topics.chunking import H_OBJECT
from astraflow.topics.codec import header
from astraflow.topics.messages import ChunkManifest
from astraflow.topics import TopicPartition, security

__all__ = ["ChunkPrefetcher"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 2 * 1024**3


class ChunkPrefetcher:
    """Tails one weights topic (partition 0) in a thread; see the module docstring.

    Args:
        bootstrap_servers: Kafka bootstrap servers.
        topic: the ``weights.<policy>`` topic.
        node_id: names the thread and client.
        want_snapshots: called per snapshot chunk: keep it? (default: always)
        max_bytes: chunk bytes held at most; the oldest payloads go first.
    """

    def __init__(self, bootstrap_servers: str, topic: str, *, node_id: str = "subscriber",
                 want_snapshots: Callable[[], bool] = lambda: True, max_bytes: int = DEFAULT_MAX_BYTES,
                 security_setting: security.ClientSecurity | None = None) -> None:
        self.topic, self.node_id, self.max_bytes = topic, node_id, max_bytes
        self._want_snapshots = want_snapshots
        self._tp = TopicPartition(topic, 0)
        self._kc = security.consumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
                                     isolation_level="read_committed", max_partition_fetch_bytes=8 * 1024 * 1024,
                                     fetch_max_bytes=64 * 1024 * 1024, client_id=f"astraflow-prefetch-{node_id}",
                                     security=security_setting)
        self._kc.assign([self._tp])
        self._kc.seek_to_end(self._tp)
        self._position = self._kc.position(self._tp)  # chunks from here on are seen
        self._first_position = self._position
        self._cond = threading.Condition()
        # object id -> {offset: (value, BLAKE3 hex of value)}, oldest object first
        self._objects: OrderedDict[str, dict[int, tuple[bytes, str]]] = OrderedDict()
        self._bytes = 0
        self._stop = threading.Event()
        self.taken = 0  #: chunks handed to a reader (tests, metrics)
        self._thread = threading.Thread(target=self._run, name=f"weight-prefetch-{node_id}", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self._kc.close()

    # -- the reader's side -------------------------------------------------------------
    def take(self, manifest: ChunkManifest, wait_s: float = 2.0) -> Mapping[int, tuple[bytes, str]]:
        """The chunks of ``manifest`` seen so far, by the offset they were read at (with their
        digests); forgets them and every payload seen before them. Waits up to ``wait_s`` until
        every chunk of the manifest is held, or the tail passed the manifest's last offset (it
        was durable before it was announced). On a mirror the manifest's offsets are the home
        cluster's: the reader places what is offered by digest, and only the wait and the
        forgetting of older payloads use offsets — this cluster's, the chunks' own."""
        if manifest.topic != self.topic or not manifest.chunks:
            return {}
        last = max(c.offset for c in manifest.chunks)
        first = min(c.offset for c in manifest.chunks)
        wanted = {c.digest for c in manifest.chunks}
        with self._cond:
            if first < self._first_position and manifest.object_id not in self._objects:
                return {}  # written before this prefetcher started: the reader fetches it
            self._cond.wait_for(lambda: self._position > last or self._stop.is_set() or wanted <= {
                d for _, d in self._objects.get(manifest.object_id, {}).values()}, wait_s)
            got = self._forget(manifest.object_id)
            # Payloads seen before this one are behind the reader: a chain is read in log order.
            here = min(got) if got else first
            for obj in [o for o, recs in self._objects.items() if recs and min(recs) < here]:
                self._forget(obj)
            self.taken += len(got)
            return got

    # -- the thread --------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._kc.poll(timeout_ms=200).get(self._tp, [])
            except Exception as e:  # noqa: BLE001 - prefetching is an optimisation: the reader fetches
                log.warning("%s: weight prefetch stopped (%s: %s); payloads are fetched after their announcement",
                            self.node_id, type(e).__name__, e)
                with self._cond:
                    self._stop.set()
                    self._cond.notify_all()
                return
            for r in batch:
                self._keep(r)
            with self._cond:
                self._position = max(self._position, self._kc.position(self._tp))
                self._cond.notify_all()

    def _keep(self, record) -> None:
        obj = header(record.headers, H_OBJECT)
        value = record.value
        if obj is None or value is None:
            return
        if header(record.headers, "af-kind") == b"snapshot" and not self._want_snapshots():
            return
        digest = blake3(value).hexdigest()  # hashed here, while the write goes on
        with self._cond:
            self._objects.setdefault(obj.decode("utf-8", "replace"), {})[record.offset] = (value, digest)
            self._bytes += len(value)
            while self._bytes > self.max_bytes and self._objects:
                self._forget(next(iter(self._objects)))  # the oldest payload

    def _forget(self, obj: str) -> dict[int, tuple[bytes, str]]:
        """Drop an object's chunks (the caller holds the lock); returns them."""
        recs = self._objects.pop(obj, {})
        self._bytes -= sum(len(v) for v, _ in recs.values())
        return recs
