"""A node's verified copy of one policy's weights, and what each engine was given from it.

:class:`HeldWeights` owns the tensors a subscriber assembled, their per-tensor hashes, the
lineage epoch and version they are, their ``weights_digest`` (computed when first asked), the
trace context of the announcement that brought them and the count of payloads applied by
kind, all under one lock that waiters (:meth:`HeldWeights.wait_for`) wait on. Engines take a
version with :meth:`HeldWeights.apply_to`, under that lock, so an engine never sees a
half-applied version; engines know their version, not its epoch, so the epoch each was
given is kept here.

Payloads come in already fetched and checked against their manifest and announcement
(:mod:`.assembly`); applying a delta checks its base digest and every tensor's result hash
(:mod:`.codec`). This module knows nothing about Kafka, announcements, chains or retries.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Mapping
from typing import NamedTuple, Protocol

import torch
from opentelemetry import context as otel_context
from opentelemetry import trace

from . import codec
from .format import WeightCodecError

__all__ = ["Held", "HeldWeights", "WeightEngine"]

log = logging.getLogger(__name__)


class WeightEngine(Protocol):
    """What :meth:`HeldWeights.apply_to` needs of a rollout engine."""

    @property
    def version(self) -> int: ...

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None: ...


class Held(NamedTuple):
    """Which weights: lineage epoch, version and ``weights_digest`` (heartbeats report it)."""

    epoch: int
    version: int
    digest: str


class HeldWeights:
    """The held version of one policy's weights; see the module docstring.

    Args:
        initial: weights to start with (copied); None: nothing is held until a snapshot.
        version: the version of ``initial`` (or of the engines' weights when it is None).
        epoch: the lineage epoch of ``version``.
        policy: names the policy in spans.
        node_id: names the node in logs and spans.
        tracer: OpenTelemetry tracer for the ``raas.weights.apply`` span.
    """

    def __init__(self, initial: Mapping[str, torch.Tensor] | None, version: int, epoch: int, *, policy: str,
                 node_id: str, tracer: trace.Tracer) -> None:
        self.policy, self.node_id, self._tracer = policy, node_id, tracer
        self.lock = threading.Condition(threading.RLock())
        # Guarded by lock: the tensors, their hashes, (epoch, version), digest and trace context.
        self._state: dict[str, torch.Tensor] | None = (
            {k: v.detach().clone() for k, v in initial.items()} if initial is not None else None)
        self._hashes: dict[str, bytes] | None = None
        self._version = version
        self._epoch = self._initial_epoch = epoch
        self._digest: str | None = None
        self._engines: weakref.WeakKeyDictionary[object, Held] = weakref.WeakKeyDictionary()
        self._context: otel_context.Context | None = None
        self._path_counts = {"delta": 0, "snapshot": 0}
        self._since = time.monotonic()  #: when the held (epoch, version) came
        #: engine loads, and the seconds the versions they loaded had been held before (what a
        #: node's calls in flight made them wait: a load needs the engine between calls)
        self._waits = {"loads": 0, "wait_s": 0.0}

    @property
    def version(self) -> int:
        return self._version

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def holds_weights(self) -> bool:
        """Whether any tensors are held (none before the first snapshot, or after a failed apply)."""
        return self._state is not None

    @property
    def path_counts(self) -> dict[str, int]:
        with self.lock:
            return dict(self._path_counts)

    @property
    def load_waits(self) -> dict[str, float]:
        """``{"loads": n, "wait_s": s}``: engine loads, and the seconds between each version being
        held here and an engine loading it, summed."""
        with self.lock:
            return dict(self._waits)

    def digest(self) -> str | None:
        """``weights_digest`` of the held weights (equal to the trainer's iff bit-identical)."""
        with self.lock:
            if self._state is None:
                return None
            if self._digest is None:
                self._digest = codec.weights_digest(self._state, self._hashes)
            return self._digest

    def held(self) -> Held | None:
        with self.lock:
            digest = self.digest()
            return None if digest is None else Held(self._epoch, self._version, digest)

    def held_by(self, engine: WeightEngine) -> Held | None:
        with self.lock:
            return self._engines.get(engine)

    def weights(self) -> dict[str, torch.Tensor]:
        with self.lock:
            return {k: v.clone() for k, v in (self._state or {}).items()}

    def wait_for(self, version: int, timeout: float, epoch: int | None = None) -> bool:
        with self.lock:
            if epoch is None:
                return self.lock.wait_for(lambda: self._version >= version, timeout)
            return self.lock.wait_for(lambda: (self._epoch, self._version) >= (epoch, version), timeout)

    def apply_to(self, engine: WeightEngine) -> int | None:
        """Load the held version into ``engine`` if it is newer; returns it, else None."""
        with self.lock:
            given = self._engines.get(engine)
            engine_epoch = given.epoch if given is not None else self._initial_epoch
            if self._state is None or (self._epoch, self._version) <= (engine_epoch, engine.version):
                return None
            with self._tracer.start_as_current_span(
                    "raas.weights.apply", context=self._context,
                    attributes={"policy": self.policy, "policy.version": self._version, "policy.epoch": self._epoch,
                                "node.id": self.node_id, "engine.version": engine.version}):
                engine.load_weights(self._state, self._version)
            self._waits["loads"] += 1
            self._waits["wait_s"] += time.monotonic() - self._since
            held = self.held()
            assert held is not None
            self._engines[engine] = held
            return self._version

    # -- what the assembly changes -----------------------------------------------------
    def apply_delta(self, payload: bytes | bytearray | memoryview, version: int,
                    context: otel_context.Context | None, threads: int) -> None:
        """Apply a verified delta payload in place, moving to ``version``.

        Raises :class:`~.codec.BaseMismatchError` (it does not fit the held version; nothing
        was written) or :class:`~.format.WeightCodecError` (a check after writing failed: the
        held tensors are dropped, as they can no longer be trusted).
        """
        with self.lock:
            assert self._state is not None
            try:
                # Verifies the base digest and the data before writing anything.
                hashes = codec.apply_in_place(payload, self._state, base_hashes=self._hashes, threads=threads)
            except codec.BaseMismatchError:
                raise
            except WeightCodecError:
                self._state, self._hashes, self._digest = None, None, None
                raise
            self._hashes, self._version, self._context = hashes, version, context
            self._digest, self._since = None, time.monotonic()
            self._path_counts["delta"] += 1
            self.lock.notify_all()

    def replace(self, state: dict[str, torch.Tensor], hashes: dict[str, bytes], epoch: int, version: int,
                context: otel_context.Context | None, deltas: int) -> None:
        """Swap in weights assembled apart (a snapshot and ``deltas`` deltas after it), if newer;
        a newer epoch replaces any version."""
        with self.lock:
            if (epoch, version) <= (self._epoch, self._version):
                return
            if epoch != self._epoch:
                log.info("%s: moving to lineage epoch %d at version %d (dropping version %d of epoch %d)",
                         self.node_id, epoch, version, self._version, self._epoch)
            self._state, self._hashes, self._version = state, hashes, version
            self._epoch, self._digest = epoch, None
            self._context, self._since = context, time.monotonic()
            self._path_counts["snapshot"] += 1
            self._path_counts["delta"] += deltas
            self.lock.notify_all()

    def drop_unless(self, epoch: int, version: int, checksum: str) -> str | None:
        """Belt and braces: if ``(epoch, version)`` is held, its digest must be ``checksum``;
        when it is not, drop the held weights and return the digest found (else None)."""
        with self.lock:
            if (self._epoch, self._version) != (epoch, version) or self._state is None:
                return None
            digest = self.digest()
            if digest == checksum:
                return None
            self._state, self._hashes, self._version, self._digest = None, None, -1, None
            return digest
