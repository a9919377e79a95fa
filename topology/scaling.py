"""The autoscaler's rule: windowed signals in, a pool-size decision out.

:class:`SignalWindow` folds what the topics say about one policy into the numbers the
rule uses, over a sliding window that starts no earlier than the previous action (what
came before it describes a pool that no longer exists):

* **trainer wait fraction** ``w`` = time the trainer waited for batches / wall time. Each
  step's ``trainer.wait_s`` counts when its metric arrives. A trainer starved of batches
  reports no steps at all, so the wait still open counts too: the trainer heartbeats
  while it polls for a batch, never while it trains, so the span its heartbeats cover
  since its last step (less one interval: it beats once as it finishes a step) is
  waiting, however long a step takes on loaded cores;
* **demand** = the pool's busy time / wall time: the node-equivalents that actually
  worked. Busy is a node's own rollouts (``raas.busy_s``) and its answers to other
  policies' episodes' role calls outside them (``raas.serve_busy_s``): a verifier pool
  serves only those, and would otherwise read as idle and shrink to its minimum;
* **stale drops** (groups that came back too late for the staleness bound) in the window.

:class:`Scaler` is the rule (the reference system's, with the guards it lacked):
``w > scale_up_wait`` → target ``ceil(G / (1 - w))`` (at least ``G + 1``), but only while
the pool is busy (demand / G >= ``scale_up_busy``): a trainer that waits on a pool that
idles waits for latency (weights reaching the nodes, the staleness bound), which more
nodes would not shorten;
``w < scale_down_wait`` and no stale drops → target ``ceil(demand / target_utilization)``
when that is below ``G``; otherwise hold. Targets are clamped to the policy's ``[min,
max]``; a change needs ``confirm`` consecutive decisions in the same direction
(hysteresis, with the gap between the two thresholds) and waits out ``cooldown_s`` after
the previous change. No decision is taken before the trainer's first step (model loading
is no signal). Once the trainer is done nothing needs new rollouts: the pools drop to
their ``min`` at once (the nodes kept there answer any task still in flight).

Pure logic: this module knows nothing about Kafka or processes.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

from astraflow.topics import Heartbeat, Metric


@dataclass(frozen=True)
class Signals:
    wait_frac: float | None  #: None: not measurable yet (no step, or too short a span)
    demand: float  #: busy node-equivalents over the span
    stale_drops: int
    span_s: float
    steps: int  #: trainer steps in the span
    trainer_done: bool = False
    lag: int | None = None  #: task lag of raas.<policy> (for the record; the rule does not need it)


class SignalWindow:
    """Windowed trainer wait and pool demand of one policy, from ``metrics`` and ``drops``."""

    def __init__(self, policy: str, window_s: float, node_policy: Callable[[str], str | None],
                 heartbeat_s: float = 2.0) -> None:
        self.policy, self.window_s, self.node_policy, self.heartbeat_s = policy, window_s, node_policy, heartbeat_s
        self.last_trainer_beat: float | None = None
        self.steps: deque[tuple[float, float, float]] = deque()  # (ts, wait_s, train_s)
        self.busy: deque[tuple[float, float]] = deque()  # (ts, busy_s)
        self.stale: deque[float] = deque()
        self.first_step_ts: float | None = None
        self.last_step_ts: float | None = None
        self.done = False
        self._pending: dict[int, dict[str, float]] = {}  # step -> wait/train seen so far

    def add_metric(self, m: Metric) -> None:
        if m.component == f"trainer.{self.policy}":
            if m.name == "trainer.done":
                self.done = True
            elif m.name in ("trainer.wait_s", "trainer.train_s") and "rank" not in m.labels:
                got = self._pending.setdefault(m.step, {})
                got[m.name] = m.value
                if len(got) == 2:
                    del self._pending[m.step]
                    self.steps.append((m.ts, got["trainer.wait_s"], got["trainer.train_s"]))
                    self.first_step_ts = self.first_step_ts or m.ts
                    self.last_step_ts = max(self.last_step_ts or m.ts, m.ts)
        elif m.name in self.BUSY and self.node_policy(str(m.labels.get("node", m.component))) == self.policy:
            self.busy.append((m.ts, m.value))

    #: a node's busy time: its own rollouts, and serving other policies' episodes outside them
    BUSY = frozenset({"raas.busy_s", "raas.serve_busy_s"})

    def add_heartbeat(self, hb: Heartbeat) -> None:
        if hb.role == "trainer" and hb.policy == self.policy and hb.status != "starting":
            self.last_trainer_beat = max(self.last_trainer_beat or hb.ts, hb.ts)

    def add_stale_drop(self, ts: float) -> None:
        self.stale.append(ts)

    def signals(self, now: float, since: float = float("-inf")) -> Signals:
        if self.first_step_ts is None:
            return Signals(None, 0.0, 0, 0.0, 0, self.done)
        start = max(now - self.window_s, since, self.first_step_ts)
        self._forget(now - self.window_s)
        span = now - start
        steps = [(ts, w, t) for ts, w, t in self.steps if ts > start]
        # A step's wait ended a train time before its metric: clip it to the span.
        waited = sum(min(w, max(0.0, ts - t - start)) for ts, w, t in steps)
        if not self.done and self.last_step_ts is not None and self.last_trainer_beat is not None:
            waited += max(0.0, self.last_trainer_beat - max(self.last_step_ts + self.heartbeat_s, start))
        busy = sum(min(b, ts - start) for ts, b in self.busy if ts > start)
        stale = sum(1 for ts in self.stale if ts > start)
        measurable = span >= self.window_s / 2
        return Signals(min(1.0, waited / span) if measurable and span > 0 else None,
                       busy / span if span > 0 else 0.0, stale, span, len(steps), self.done)

    def _forget(self, before: float) -> None:
        for q in (self.steps, self.busy):
            while q and q[0][0] < before:
                q.popleft()
        while self.stale and self.stale[0] < before:
            self.stale.popleft()


@dataclass(frozen=True)
class Decision:
    action: str  #: "up", "down" or "hold"
    current: int
    target: int
    reason: str


class Scaler:
    """The rule with min/max, hysteresis and cooldown, for one policy's pools (``lo``..``hi`` nodes)."""

    def __init__(self, lo: int, hi: int, *, scale_up_wait: float, scale_down_wait: float, cooldown_s: float,
                 confirm: int, target_utilization: float, scale_up_busy: float = 0.6, **_: object) -> None:
        self.lo, self.hi, self.busy = lo, hi, scale_up_busy
        self.up, self.down, self.cooldown_s = scale_up_wait, scale_down_wait, cooldown_s
        self.confirm, self.util = confirm, target_utilization
        self.last_action = float("-inf")
        self._streak: tuple[str, int] = ("hold", 0)

    def decide(self, s: Signals, current: int, now: float) -> Decision:
        if s.trainer_done and current > self.lo:
            self.last_action = now
            return Decision("down", current, self.lo, "the trainer is done: releasing nodes down to min")
        want, direction, why = self._propose(s, current)
        if direction == "hold":
            self._streak = ("hold", 0)
            return Decision("hold", current, current, why)
        target = min(self.hi, max(self.lo, want))
        if target == current:
            self._streak = ("hold", 0)
            return Decision("hold", current, current, f"{why}; already at {'max' if direction == 'up' else 'min'}")
        same = self._streak[1] + 1 if self._streak[0] == direction else 1
        self._streak = (direction, same)
        if same < self.confirm:
            return Decision("hold", current, target, f"{why}; {same} of {self.confirm} agreeing decisions")
        if now - self.last_action < self.cooldown_s:
            return Decision("hold", current, target, f"{why}; cooling down "
                                                     f"({now - self.last_action:.0f}s of {self.cooldown_s:.0f}s)")
        self.last_action = now
        self._streak = ("hold", 0)
        return Decision(direction, current, target, why)

    def _propose(self, s: Signals, current: int) -> tuple[int, str, str]:
        if s.trainer_done:
            return current, "hold", "the trainer is done"
        if s.wait_frac is None:
            return current, "hold", "no measurement yet (the trainer has not stepped, or the window is short)"
        w = s.wait_frac
        if w > self.up:
            if current and s.demand / current < self.busy:
                return current, "hold", (f"trainer waits {w:.0%} but the pool is {s.demand / current:.0%} busy "
                                         f"(< {self.busy:.0%}): latency, not capacity")
            raw = math.ceil(current / (1.0 - w)) if w < 1.0 else self.hi
            return max(current + 1, raw), "up", f"trainer waits {w:.0%} > {self.up:.0%}"
        if w < self.down:
            if s.stale_drops:
                return current, "hold", f"trainer waits {w:.0%} but {s.stale_drops} stale drop(s): the pool is late"
            need = max(1, math.ceil(s.demand / self.util))
            if need >= current:
                return current, "hold", f"trainer waits {w:.0%}; busy {s.demand:.2f} nodes needs all {current}"
            return need, "down", f"trainer waits {w:.0%} < {self.down:.0%}; busy {s.demand:.2f} nodes"
        return current, "hold", f"trainer waits {w:.0%}, within [{self.down:.0%}, {self.up:.0%}]"
