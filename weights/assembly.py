"""How a node reaches an announced version: the delta path or the snapshot path, every byte checked.

:class:`VersionAssembler` moves a :class:`~.held.HeldWeights` to an announcement's version:

* **delta path** — when the node holds a version on the announced chain, it fetches and
  applies the deltas after it, in order (a follower applies exactly one per version);
* **snapshot path** — when it holds nothing, holds a version off the chain (too old, a
  late joiner, another lineage epoch), or a delta is missing, corrupt or does not fit its
  weights, it loads the chain's snapshot and the deltas after it into fresh tensors and
  swaps them in. The snapshot is decoded while it arrives, and each decoded tensor's
  payload bytes go back to the OS, so it is never held whole beside its tensors.

Every chunk's BLAKE3 digest, the manifest's, each payload's header (kind, version), the
delta's base digest, every tensor's result hash and the announced digest of the full
weights are checked before a version counts as held; a failure raises :class:`PathFailed`
with the report. A payload that failed verification is remembered and never fetched again.
With a prefetcher (:mod:`.prefetch`), chunks read during their write are offered to the
reader, which checks them like fetched ones.

It knows nothing about following the ``versions`` topic, signatures, retries or fault
callbacks (that is :mod:`.subscriber`), nor about engines.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import torch
from opentelemetry import context as otel_context

from astraflow.topics import (ChunkError, ChunkManifest, ChunkReader, CorruptChunkError, ReleasableBuffer,
                              VersionAnnouncement)

from . import codec
from .format import PayloadKind, WeightCodecError, read_table
from .held import HeldWeights
from .prefetch import ChunkPrefetcher

__all__ = ["PathFailed", "PayloadSource", "VersionAssembler"]


class PathFailed(Exception):
    """One path to a version failed; the message is the fault report."""


class PayloadSource(NamedTuple):
    """Where payloads come from on the subscriber's current connection."""

    reader: ChunkReader
    prefetcher: ChunkPrefetcher | None  #: chunks read while they were written, offered to the reader


class _ReadAborted(Exception):
    """The payload being decoded will not arrive (the fetch failed)."""


class _Arrival:
    """How much of a payload has arrived, for a decoder running alongside the fetch."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._have = 0
        self._aborted = False

    def advance(self, nbytes: int) -> None:
        with self._cond:
            self._have = nbytes
            self._cond.notify_all()

    def abort(self) -> None:
        with self._cond:
            self._aborted = True
            self._cond.notify_all()

    def ready(self, nbytes: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._have >= nbytes or self._aborted)
            if self._have < nbytes:
                raise _ReadAborted(f"the fetch stopped before byte {nbytes}")


class VersionAssembler:
    """Moves ``held`` along announced chains; see the module docstring.

    Args:
        held: the weights to move.
        node_id: names the decoder thread.
        codec_threads: threads for decoding and applying payloads.
    """

    def __init__(self, held: HeldWeights, *, node_id: str, codec_threads: int = 1) -> None:
        self.held, self.node_id, self.codec_threads = held, node_id, codec_threads
        self._bad: set[str] = set()  # object ids that failed verification: never fetched again
        self.prefetched = 0  #: chunks the prefetcher offered for payloads fetched so far

    def delta_steps(self, head: VersionAnnouncement) -> list[tuple[int, ChunkManifest]] | None:
        """The deltas from the held version to ``head``, or None when there is no such path."""
        if not self.held.holds_weights or head.epoch != self.held.epoch:
            return None  # another lineage: only its snapshot leads there
        v = self.held.version
        if head.base_version == v and head.base_version != head.version:
            steps = [(head.version, head.manifest)]  # a follower, one version behind
        else:
            chain = [head.snapshot_version, *head.delta_versions]
            if v not in chain or len(head.delta_versions) != len(head.deltas):
                return None
            steps = list(zip(head.delta_versions, head.deltas))[chain.index(v):]
        return None if any(m.object_id in self._bad for _, m in steps) else steps

    def apply_deltas(self, source: PayloadSource, steps: list[tuple[int, ChunkManifest]],
                     head: VersionAnnouncement, context: otel_context.Context | None) -> None:
        """The delta path: apply ``steps`` (from :meth:`delta_steps`) to the held weights in place."""
        for version, manifest in steps:
            payload = self._fetch(source, manifest, version, PayloadKind.DELTA, _expect(head, version))
            held = self.held.version
            try:
                self.held.apply_delta(payload, version, context, self.codec_threads)
            except codec.BaseMismatchError as e:
                raise PathFailed(f"delta to version {version} does not fit the held version {held}: {e}") from e
            except WeightCodecError as e:
                self._bad.add(manifest.object_id)
                raise PathFailed(f"delta to version {version} failed to apply ({e}); "
                                 "dropped the held weights") from e
        self._check_head(head)

    def load_snapshot(self, source: PayloadSource, head: VersionAnnouncement,
                      context: otel_context.Context | None) -> None:
        """The snapshot path: assemble ``head`` in fresh tensors from its snapshot, then swap them in."""
        snap = head.snapshot_manifest
        if snap is None:
            raise PathFailed(f"announcement of version {head.version} names no snapshot")
        if snap.object_id in self._bad:
            raise PathFailed(f"snapshot {head.snapshot_version} failed verification before")
        payload, state = self._fetch_and_decode_snapshot(source, snap, head)
        hashes = {e.name: e.hash for e in read_table(payload)[1]}
        del payload
        version, error, intact = head.snapshot_version, None, True
        for dv, manifest in zip(head.delta_versions, head.deltas):
            try:
                if manifest.object_id in self._bad:
                    raise PathFailed(f"delta to version {dv} failed verification before")
                payload = self._fetch(source, manifest, dv, PayloadKind.DELTA, _expect(head, dv))
                hashes = codec.apply_in_place(payload, state, base_hashes=hashes, threads=self.codec_threads)
            except (PathFailed, codec.BaseMismatchError) as e:
                error = e  # raised before anything was written: `state` still holds `version`
                break
            except WeightCodecError as e:
                self._bad.add(manifest.object_id)
                error, intact = e, False
                break
            version = dv
        # Even a partial chain is a verified, newer version; a newer epoch replaces any version.
        if intact:
            self.held.replace(state, hashes, head.epoch, version, context,
                              deltas=len([v for v in head.delta_versions if v <= version]))
        if error is not None:
            raise PathFailed(f"snapshot path stopped at version {version}: {error}")
        self._check_head(head)

    def _fetch_and_decode_snapshot(self, source: PayloadSource, snap: ChunkManifest,
                                   head: VersionAnnouncement) -> tuple[memoryview, dict[str, torch.Tensor]]:
        """Fetch a snapshot and decode it while it arrives: a decoder thread takes each tensor
        as soon as its chunks are verified (the payload's head is fetched first), so decoding
        overlaps the transfer instead of following it, and gives each decoded tensor's bytes
        back to the OS, so the payload is never held whole beside the tensors it becomes."""
        buf = ReleasableBuffer(snap.total_bytes)
        arrival = _Arrival()
        outcome: dict[str, object] = {}

        def decode() -> None:
            try:
                outcome["state"] = codec.decode_streaming(buf.view, arrival.ready, threads=self.codec_threads,
                                                          release=buf.release)
            except BaseException as e:  # noqa: BLE001 - handed to the subscriber's thread below
                outcome["error"] = e

        decoder = threading.Thread(target=decode, name=f"weight-decoder-{self.node_id}", daemon=True)
        decoder.start()
        try:
            payload = self._fetch(source, snap, head.snapshot_version, PayloadKind.SNAPSHOT,
                                  _expect(head, head.snapshot_version), into=buf.view,
                                  on_progress=arrival.advance)
        except BaseException:
            arrival.abort()
            raise
        finally:
            decoder.join()
        error = outcome.get("error")
        if isinstance(error, WeightCodecError):
            self._bad.add(snap.object_id)
            raise PathFailed(f"snapshot {head.snapshot_version} does not decode: {error}") from error
        if error is not None:
            raise error  # type: ignore[misc]
        return payload, outcome["state"]  # type: ignore[return-value]

    def _fetch(self, source: PayloadSource, manifest: ChunkManifest, version: int, kind: PayloadKind,
               digest: str | None = None, **read: object) -> bytearray | memoryview:
        """The verified payload of ``version``; ``digest``: the announced digest it must produce.

        ``read``: passed to :meth:`ChunkReader.read` (a buffer to fill, a progress callback).
        """
        if source.prefetcher is not None:
            read["cached"] = cached = source.prefetcher.take(manifest)
            self.prefetched += len(cached)
        try:
            # Checks the manifest and every chunk's digest.
            payload = source.reader.read(manifest, **read)  # type: ignore[arg-type]
        except ChunkError as e:
            if isinstance(e, CorruptChunkError):
                self._bad.add(manifest.object_id)
            raise PathFailed(f"{kind.name.lower()} of version {version}: {type(e).__name__}: {e}") from e
        try:
            header = codec.read_header(payload)
        except WeightCodecError as e:
            self._bad.add(manifest.object_id)
            raise PathFailed(f"{kind.name.lower()} of version {version} is not a weight payload: {e}") from e
        if header.version != version or header.kind != kind:
            self._bad.add(manifest.object_id)
            raise PathFailed(f"announced {kind.name.lower()} of version {version} holds a "
                             f"{header.kind.name.lower()} of version {header.version}")
        if digest is not None and header.digest != digest:
            self._bad.add(manifest.object_id)
            raise PathFailed(f"{kind.name.lower()} of version {version} produces weights digest "
                             f"{header.digest[:16]}…, the announcement says {digest[:16]}…")
        return payload

    def _check_head(self, head: VersionAnnouncement) -> None:
        """Belt and braces: the held weights must have the announced digest.

        Each payload's result digest was compared with the announcement before it was
        applied, and apply_in_place checked every tensor, so this only trips on a bug.
        """
        digest = self.held.drop_unless(head.epoch, head.version, head.checksum)
        if digest is not None:
            raise PathFailed(f"version {head.version} assembled with digest {digest[:16]}…, announced "
                             f"{head.checksum[:16]}…; dropped the held weights")


def _expect(head: VersionAnnouncement, version: int) -> str | None:
    return head.checksum if version == head.version else None
