"""Who may use a node's rollout engine at once.

A rollout engine that batches concurrent calls itself (an SGLang server, an emulated device
with a cost profile: ``concurrent_calls = True``) takes several ``generate`` calls at a
time, from the node's episodes and from the requests it serves for other pools; a weight
load must still find it idle, so that every row of a call comes from one version. The CPU
engine computes one call at a time, so there every use is exclusive, as a plain lock.

:class:`EngineGate` is that rule: ``with gate:`` is exclusive (weight loads; any use of an
engine that is not concurrent), ``with gate.call():`` is a generate call (shared when the
engine is concurrent), and ``with gate.try_exclusive() as got:`` takes it alone only if that
needs no wait (the weight refresh between calls, skipped while calls are in flight; the
node's step applies new weights between polls). A waiting exclusive use holds back new calls,
so a weight load is never starved. It knows nothing about Kafka or episodes.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

__all__ = ["EngineGate"]


class EngineGate:
    def __init__(self, engine=None, *, concurrent: bool | None = None) -> None:
        self.concurrent = bool(getattr(engine, "concurrent_calls", False)) if concurrent is None else concurrent
        self._cv = threading.Condition()
        self._calls = 0  #: generate calls in flight (shared uses)
        self._exclusive = False
        self._exclusive_waiting = 0
        self.peak_calls = 0  #: the most calls in flight at once

    def __enter__(self) -> EngineGate:
        with self._cv:
            self._exclusive_waiting += 1
            try:
                self._cv.wait_for(lambda: not self._exclusive and not self._calls)
            finally:
                self._exclusive_waiting -= 1
            self._exclusive = True
        return self

    def __exit__(self, *exc) -> None:
        with self._cv:
            self._exclusive = False
            self._cv.notify_all()

    @contextmanager
    def try_exclusive(self):
        """Yields True with the engine held alone, or False at once if that would wait."""
        with self._cv:
            got = not self._exclusive and not self._calls
            if got:
                self._exclusive = True
        try:
            yield got
        finally:
            if got:
                self.__exit__()

    @contextmanager
    def call(self):
        """One generate call: shared with other calls on a concurrent engine, else exclusive."""
        if not self.concurrent:
            with self:
                yield
            return
        with self._cv:
            self._cv.wait_for(lambda: not self._exclusive and not self._exclusive_waiting)
            self._calls += 1
            self.peak_calls = max(self.peak_calls, self._calls)
        try:
            yield
        finally:
            with self._cv:
                self._calls -= 1
                self._cv.notify_all()
