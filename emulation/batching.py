"""Several generate calls at once on an emulated device: one continuous batch per device.

A real rollout server (SGLang) takes requests as they come and batches every request in
flight, step by step; a request that arrives while others decode joins their batch at the
next step. A call joins the schedule when it arrives (:meth:`BatchingClock.admit`), each
row at its sampling's ``max_new_tokens``, and is settled to the lengths the real work
generated once that is done (:meth:`BatchingClock.run`): the real work of concurrent calls
runs one at a time, so the schedule must not wait for it to learn who is in the batch. :class:`BatchingClock` is that schedule for an emulated rollout engine of
``count`` devices (engine replicas): it keeps one :class:`~.cost.ContinuousBatch` per device
on one modelled timeline (``modelled = wall / dilation`` since the clock began), sends each
row of a call to the device holding the least context (a router), and holds the calling
thread until the modelled step that finishes the call's last row has passed. An arrival
changes the schedule of the calls in flight (their steps decode a larger batch), so every
waiting call recomputes its finish when one comes.

Steps are applied once they have started (a step that began before ``now`` is committed
with the batch it had), so the timeline never runs ahead of what the engine was given.
:attr:`busy_s` is the modelled time at least one device had rows: the work the device
group did, which overlapping calls share (their latencies would count it twice).

:meth:`BatchingClock.pause` and :meth:`BatchingClock.resume` are the devices going away and
coming back (a trainer that shares them claimed them, ``emulation/share.py``): while paused
no step starts (what was left of a step in progress is decoded after); on resume each device
first prefills again the context its running rows held (their KV cache went with the
devices), counted as device work. It knows nothing about engines, Kafka or which component
holds it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

from .cost import ContinuousBatch, CostModel

__all__ = ["BatchingClock", "CallTiming"]


class CallTiming(NamedTuple):
    """What one call cost on the shared schedule (modelled seconds)."""

    latency_s: float  #: from its arrival to its last row's finish on the schedule
    joined: bool  #: it arrived while other calls' rows were in flight


class _Device:
    __slots__ = ("batch", "t", "owed")

    def __init__(self, cost: CostModel) -> None:
        self.batch = ContinuousBatch(cost)
        self.t = 0.0  #: modelled time at which its next step starts
        self.owed = 0.0  #: paused: what was left of the step it was decoding when the devices went away


class BatchingClock:
    """The shared continuous-batching schedule of ``devices`` emulated devices (thread-safe)."""

    def __init__(self, cost: CostModel, devices: int, dilation: float) -> None:
        if devices < 1 or dilation <= 0:
            raise ValueError("BatchingClock needs devices >= 1 and dilation > 0")
        self.cost, self.dilation = cost, dilation
        self._devices = [_Device(cost) for _ in range(devices)]
        self._cv = threading.Condition()
        self._wall0 = time.monotonic()
        self._ids = itertools.count()
        self._left: dict[int, int] = {}  #: call id -> its rows not yet finished
        self._done_at: dict[int, float] = {}  #: call id -> when its latest finished row finished
        self._rows: dict[int, list] = {}  #: call id -> (device, row) of rows not settled yet
        self._settled: dict[int, list] = {}  #: call id -> (device, row) of its rows once settled, until done
        self._joined: dict[int, bool] = {}
        self._busy_until = 0.0
        self.busy_s = 0.0  #: modelled seconds at least one device had rows
        self._paused_at: float | None = None  #: modelled time the devices went away (None: they are here)
        self.paused_s = 0.0  #: modelled seconds the devices were away
        self.recompute_s = 0.0  #: modelled seconds of prefilling held context again on coming back

    def now(self) -> float:
        return (time.monotonic() - self._wall0) / self.dilation

    def admit(self, prompts: Sequence[float], max_tokens: int, arrived: float,
              factors: Sequence[float] | None = None) -> int:
        """A call arrives at modelled time ``arrived`` with rows of these prompt lengths (real
        tokens, generated context weighted: :meth:`~.cost.CostModel.prompt_units`),
        each generating at most ``max_tokens`` (its modelled length scaled by its ``factors``
        entry, :meth:`CostModel.length_factor`): its rows join the schedule now, before the
        real work says how long they are (:meth:`run` settles that); returns the call's id."""
        factors = factors or [1.0] * len(prompts)
        with self._cv:
            self._advance(arrived)
            call = next(self._ids)
            self._joined[call] = any(not d.batch.idle for d in self._devices)
            self._rows[call] = []
            self._left[call] = len(prompts)
            for p, f in zip(prompts, factors):
                dev = min(self._devices, key=lambda d: d.batch.load())
                if dev.batch.idle:
                    dev.t = max(dev.t, arrived)
                self._rows[call].append((dev, dev.batch.add(call, p, max_tokens, f)))
            self._cv.notify_all()  # the calls in flight have a new schedule
        return call

    def run(self, call: int, lengths: Sequence[int], arrived: float) -> CallTiming:
        """Settle ``call``'s rows to the lengths the real work generated (at most what
        :meth:`admit` was told) and block until they are all decoded."""
        self.settle(call, lengths)
        timing = self.wait(call, arrived)
        assert timing is not None
        return timing

    def settle(self, call: int, lengths: Sequence[int]) -> None:
        """Settle ``call``'s rows to the lengths the real work generated (at most what
        :meth:`admit` was told); they stay on the schedule until :meth:`wait` sees them decoded."""
        with self._cv:
            self._settled[call] = self._rows.pop(call)
            for (dev, row), n in zip(self._settled[call], lengths):
                dev.batch.settle(row, n)
            self._cv.notify_all()

    def wait(self, call: int, arrived: float, until: float | None = None) -> CallTiming | None:
        """Block until ``call``'s settled rows are all decoded (its timing), or until modelled
        time ``until`` has passed (None: the call is not done yet)."""
        with self._cv:
            while self._left[call]:
                if until is not None and self.now() >= until:
                    return None
                if self._paused_at is not None:  # no step starts until the devices are back
                    self._cv.wait(None if until is None else max(0.0, (until - self.now()) * self.dilation))
                    continue
                finish = self._finish_of(call) if until is None else min(self._finish_of(call), until)
                wait = finish * self.dilation - (time.monotonic() - self._wall0)
                if wait > 0:
                    self._cv.wait(wait)
                self._advance(self.now())
            del self._left[call]
            self._settled.pop(call, None)
            finished = self._done_at.pop(call, arrived)
            return CallTiming(max(0.0, finished - arrived), self._joined.pop(call))

    def progress(self, call: int) -> list[float | None]:
        """Of each row of a settled ``call`` (in order), the modelled tokens decoded so far, or
        None once it is finished (a partial rollout continues the rows still running, and those
        still waiting from their start)."""
        with self._cv:
            self._advance(self.now())
            out: list[float | None] = []
            for dev, row in self._settled.get(call, []):
                out.append(float(row[3]) if dev.batch.holds(row) and row[3] < row[2] else None)
            return out

    def resettle(self, call: int, index: int, length: int) -> None:
        """Row ``index`` of a settled ``call`` now generates ``length`` real tokens in all (a
        partial rollout regenerated its rest under new weights); finished rows are left alone."""
        with self._cv:
            dev, row = self._settled[call][index]
            if dev.batch.holds(row):
                dev.batch.settle(row, length)
            self._cv.notify_all()

    def cancel(self, call: int) -> None:
        """The real work failed: the call's rows leave the schedule."""
        with self._cv:
            self._settled.pop(call, None)
            for dev, row in self._rows.pop(call, []):
                dev.batch.settle(row, 0)
            self._left.pop(call, None)
            self._joined.pop(call, None)
            self._cv.notify_all()

    def pause(self) -> None:
        """The devices go away: the steps that started by now are applied, no other starts, and
        what is left of a step in progress is owed until they are back."""
        with self._cv:
            if self._paused_at is None:
                now = self.now()
                self._advance(now)
                self._paused_at = now
                for d in self._devices:
                    d.owed = max(0.0, d.t - now)

    def resume(self, recompute: bool = True) -> None:
        """The devices are back: each device with running rows first prefills again the context
        they held (``recompute``: the devices were away; False: they were never used), then
        its steps go on from now."""
        with self._cv:
            if self._paused_at is None:
                return
            now = self.now()
            self.paused_s += now - self._paused_at
            self._paused_at = None
            redo = 0.0
            for d in self._devices:
                owed, d.owed = d.owed, 0.0
                if d.batch.idle:
                    continue
                took = self.cost.prefill_modelled_s(d.batch.held_context()) if recompute else 0.0
                d.t = now + took + owed
                redo = max(redo, took)
            if redo:
                self.recompute_s += redo
                self.busy_s += redo
                self._busy_until = max(self._busy_until, now + redo)
            self._cv.notify_all()

    def _advance(self, to: float) -> None:
        """Apply every step that starts by modelled time ``to`` (and not after a pause), in start
        order across devices."""
        if self._paused_at is not None:
            to = min(to, self._paused_at)
        while True:
            ready = [d for d in self._devices if not d.batch.idle and d.t <= to]
            if not ready:
                return
            dev = min(ready, key=lambda d: d.t)
            took, done = dev.batch.step()
            start, end = dev.t, dev.t + took
            self.busy_s += max(0.0, end - max(start, self._busy_until))
            self._busy_until = max(self._busy_until, end)
            dev.t = end
            for call in done:
                if call in self._left:  # (not a cancelled call's)
                    self._left[call] -= 1
                    self._done_at[call] = end

    def _finish_of(self, call: int) -> float:
        """When ``call``'s last row finishes if nothing else arrives (a dry run on copies)."""
        finish = 0.0
        for d in self._devices:
            mine = sum(1 for r in d.batch.waiting + d.batch.running if r[0] == call)
            if not mine:
                continue
            batch, t = d.batch.copy(), d.t
            while mine:
                took, done = batch.step()
                t += took
                mine -= sum(1 for tag in done if tag == call)
            finish = max(finish, t)
        return finish
