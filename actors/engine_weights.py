"""When a RaaS node's engine takes new weights, and the one place it does.

The subscriber (:class:`~astraflow.weights.WeightSubscriber`) holds the newest version it
has verified; :meth:`EngineWeights.apply` puts it into the engine, always with the engine
alone, so every row of a call comes from one version — unless ``rollout.partial`` is on, when the
engine also asks between two tokens of a call (:meth:`EngineWeights.refresh_mid_call`). It happens between the episodes'
engine calls (the batcher's ``before_call``), before a served call when no call is in
flight, in a load that waits for the calls in flight (which the node's loop runs on a
thread of its own, so it goes on polling), and while the node waits for the version a
task was scheduled at. A shared pool's node holds more than its own policy's weights: the
adapters of the other policies it serves (``others``: each its subscriber and its adapter
engine) are applied at the same moments, each at its own policy's newest version; only the
node's own policy's version is waited for (a remote role's pool waits for none either).
It knows nothing about Kafka records, tasks or metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from astraflow.engines.gate import EngineGate
from astraflow.weights import WeightSubscriber

from . import fault_points


class EngineWeights:
    """A node's engine and the subscriber it takes its weights from."""

    def __init__(self, subscriber: WeightSubscriber, engine, engine_lock: EngineGate, name: str,
                 others: list[tuple[WeightSubscriber, object]] = ()) -> None:
        self.subscriber, self.engine, self.engine_lock, self.name = subscriber, engine, engine_lock, name
        self.others = list(others)  #: (subscriber, engine) of the other policies this node serves
        self._loader = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-load")
        self._loading: Future | None = None  #: a load waiting for the engine's calls in flight

    def apply(self) -> None:
        """The newest weights the subscribers hold into the engines; the caller holds the engine alone."""
        self.subscriber.apply_to(self.engine)
        for subscriber, engine in self.others:
            subscriber.apply_to(engine)

    def refresh_mid_call(self) -> None:
        """Partial rollouts: the engine asks between two tokens of a call, on the calling thread,
        which holds the engine (``rollout.partial``; ``CpuEngine.set_weight_refresh``). Only the
        node's own policy: a shared pool's adapters are loaded between calls."""
        fault_points.reach(fault_points.BETWEEN_TOKENS, self.name)
        self.subscriber.apply_to(self.engine)

    def load(self, wait: bool = True) -> None:
        """Take the engine alone and apply: once the calls in flight end, or (``wait=False``)
        only if none is in flight."""
        if wait:
            with self.engine_lock:
                self.apply()
            return
        with self.engine_lock.try_exclusive() as alone:
            if alone:
                self.apply()

    def held(self):
        """The lineage the engine rolls out with (None: none loaded through the subscriber)."""
        return self.subscriber.held_by(self.engine)

    def newer(self) -> bool:
        """A subscriber holds a version its engine has not loaded (asked without the engine:
        a load takes it alone only when there is something to load)."""
        return any(_newer(s, e) for s, e in [(self.subscriber, self.engine), *self.others])

    def load_beside(self) -> None:
        """Load newer weights on a thread of their own. A load needs the engine idle, so it waits
        for the calls in flight (the gate holds new ones back meanwhile), which on an emulated or
        GPU engine can take a long call's time; the caller meanwhile goes on polling, so the
        node never holds up its group's rebalances (a join waits for every member's poll, and
        each rebalance fences the polls in flight of every node)."""
        if self._loading is not None:
            if not self._loading.done():
                return
            loading, self._loading = self._loading, None
            loading.result()  # a load that raised fails the caller's step
        if self.newer():
            self._loading = self._loader.submit(self.load)

    def wait_for(self, version: int, limit_s: float, while_waiting: Callable[[], None]) -> None:
        """Load until the engine has ``version``; TimeoutError after ``limit_s``."""
        deadline = time.monotonic() + limit_s
        while self.engine.version < version:
            if time.monotonic() > deadline:
                refused = self.subscriber.rejected  # e.g. wrong_base: a LoRA policy's adapters for another model
                raise TimeoutError(f"{self.name}: weights version {version} did not arrive within "
                                   f"{limit_s:.0f}s (have {self.engine.version})" + (
                                       f"; versions refused: {refused} (reasons on the dead-letter topic)"
                                       if refused else ""))
            self.subscriber.wait_for(version, timeout=1.0)
            self.load()
            while_waiting()

    def close(self) -> None:
        self._loader.shutdown(wait=False, cancel_futures=True)
        self.subscriber.close()
        for subscriber, _ in self.others:
            subscriber.close()


def _newer(subscriber: WeightSubscriber, engine) -> bool:
    held = subscriber.held_by(engine)
    if held is None:
        return subscriber.version > engine.version
    return (subscriber.epoch, subscriber.version) > (held.epoch, held.version)
