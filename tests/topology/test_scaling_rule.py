"""The autoscaler's rule and its windowed signals, on recorded metric sequences (pure logic)."""

from __future__ import annotations

import pytest

from astraflow.topics import Heartbeat, Metric
from astraflow.topology.scaling import Scaler, Signals, SignalWindow

SPEC = dict(scale_up_wait=0.10, scale_down_wait=0.05, cooldown_s=30.0, confirm=2, target_utilization=0.8)


def sig(w, demand=0.0, stale=0):
    return Signals(w, demand, stale, span_s=60.0, steps=5)


def busy(w, nodes):
    """The trainer waits ``w`` and every one of ``nodes`` is busy all the time."""
    return sig(w, demand=float(nodes))


def test_scale_up_follows_the_reference_formula_within_max():
    s = Scaler(1, 8, **SPEC)
    assert s.decide(busy(0.5, 2), 2, now=100).action == "hold"  # first of two agreeing decisions
    d = s.decide(busy(0.5, 2), 2, now=105)
    assert (d.action, d.target) == ("up", 4)  # ceil(2 / (1 - 0.5))
    s = Scaler(1, 3, **SPEC)
    s.decide(busy(0.9, 2), 2, now=0)
    assert s.decide(busy(0.9, 2), 2, now=1).target == 3  # ceil(2 / 0.1) = 20, clamped to max
    s = Scaler(1, 8, **SPEC)
    s.decide(busy(0.11, 5), 5, now=0)
    assert s.decide(busy(0.11, 5), 5, now=1).target == 6  # the formula says 5.6 -> 6; at least G + 1 anyway


def test_scale_down_towards_the_demand_consumed_never_below_min():
    s = Scaler(2, 8, **SPEC)
    s.decide(sig(0.01, demand=0.4), 6, now=0)
    d = s.decide(sig(0.01, demand=0.4), 6, now=1)
    assert (d.action, d.target) == ("down", 2)  # ceil(0.4 / 0.8) = 1, clamped to min 2
    s = Scaler(1, 8, **SPEC)
    s.decide(sig(0.01, demand=2.0), 6, now=0)
    assert s.decide(sig(0.01, demand=2.0), 6, now=1).target == 3  # ceil(2.0 / 0.8)


@pytest.mark.parametrize("signals, why", [
    (sig(0.07), "within"),  # between the thresholds: the hysteresis band
    (sig(0.5, demand=1.6), "latency, not capacity"),  # waiting on a pool 40% busy: more nodes would idle
    (sig(0.01, demand=5.0), "needs all"),  # idle trainer but the pool is busy
    (sig(0.01, demand=0.1, stale=3), "stale drop"),  # late groups: not the time to shrink
    (sig(None), "no measurement"),
    (Signals(0.9, 0.0, 0, 60.0, 5, trainer_done=True), "done"),  # already at min: nothing to release
])
def test_holds(signals, why):
    s = Scaler(4 if signals.trainer_done else 1, 8, **SPEC)
    for now in range(5):
        d = s.decide(signals, 4, now=now)
        assert d.action == "hold" and why in d.reason


def test_no_second_action_within_the_cooldown_and_no_flapping():
    s = Scaler(1, 8, **SPEC)
    actions = []
    # the wait fraction swings every 2 s between starving and idle: a naive rule would flap
    for i in range(60):
        now = i * 2.0
        d = s.decide(busy(0.6, 4) if (i // 3) % 2 == 0 else sig(0.0, demand=0.5), 4, now)
        if d.action != "hold":
            actions.append(now)
    assert len(actions) >= 2 and all(b - a >= SPEC["cooldown_s"] for a, b in zip(actions, actions[1:]))
    # and a single contrary reading resets the streak: alternating signals never act
    s = Scaler(1, 8, **SPEC)
    assert all(s.decide(busy(0.6, 4) if i % 2 else sig(0.0, demand=0.5), 4, i * 40.0).action == "hold"
               for i in range(10))


def metric(name, value, ts, step=0, component="trainer.policy", **labels):
    return Metric(component, name, value, step, ts, labels)


def test_window_measures_wait_and_demand():
    w = SignalWindow("policy", 20.0, node_policy=lambda node: "policy" if node.startswith("raas") else None)
    assert w.signals(now=50).wait_frac is None  # no step yet: model loading is no signal
    for step, ts in enumerate((100.0, 104.0, 108.0, 112.0, 116.0, 120.0), 1):
        w.add_metric(metric("trainer.wait_s", 3.0, ts, step))
        w.add_metric(metric("trainer.train_s", 1.0, ts, step))
        w.add_metric(metric("raas.busy_s", 2.0, ts, component="raas-0", node="raas-0"))
        w.add_metric(metric("raas.busy_s", 9.0, ts, component="other-0", node="other-0"))  # another policy's
    s = w.signals(now=120.0)
    assert s.wait_frac == pytest.approx(0.75)  # 3 s of every 4 s step waiting
    assert s.demand == pytest.approx(0.5)  # 2 busy seconds every 4 s
    # after its last step the trainer beats once; then silence: it is training (however slowly) ...
    w.add_heartbeat(Heartbeat("trainer.policy", "trainer", "policy", 6, ts=120.1))
    assert w.signals(now=135.0).wait_frac == pytest.approx(3.0 / 20)  # the waits of steps 5, 6 within (115, 135]
    # ... while beats go on, it is polling for a batch that does not come: waiting, not unknown
    for ts in range(122, 136, 2):
        w.add_heartbeat(Heartbeat("trainer.policy", "trainer", "policy", 6, ts=float(ts)))
        w.add_heartbeat(Heartbeat("trainer.other", "trainer", "other", 6, ts=float(ts) + 10))  # not ours
    assert w.signals(now=135.0).wait_frac == pytest.approx((3.0 + 134 - 122) / 20)
    # the window starts after the last action: before it, another pool size was measured
    assert w.signals(now=125.0, since=118.0).wait_frac is None  # span 7 s < half the window
    w.add_metric(metric("trainer.done", 6, 121.0))
    assert w.signals(now=130.0).trainer_done


def test_a_done_trainer_releases_the_pool_to_min_at_once():
    s = Scaler(2, 8, **SPEC)
    s.last_action = 99.0  # inside the cooldown, and no agreeing decisions: a finished job waits for neither
    d = s.decide(Signals(0.0, 0.0, 0, 60.0, 5, trainer_done=True), 6, now=100.0)
    assert (d.action, d.target) == ("down", 2) and "trainer is done" in d.reason


def test_serving_other_policies_episodes_is_demand():
    """A verifier pool has no tasks of its own: its nodes answer the solver's episodes' role
    calls (``raas.serve_busy_s``). That is its demand, beside any rollouts of its own; an
    idle window would shrink the pool to its minimum while the solver waits on it."""
    w = SignalWindow("verifier", 20.0, node_policy=lambda node: node.split("-")[0])
    for step, ts in enumerate((100.0, 104.0, 108.0, 112.0, 116.0, 120.0), 1):
        w.add_metric(metric("trainer.wait_s", 3.0, ts, step, component="trainer.verifier"))
        w.add_metric(metric("trainer.train_s", 1.0, ts, step, component="trainer.verifier"))
        w.add_metric(metric("raas.serve_busy_s", 3.6, ts, component="verifier-raas-0", node="verifier-raas-0"))
        w.add_metric(metric("raas.busy_s", 0.4, ts, component="verifier-raas-0", node="verifier-raas-0"))
        w.add_metric(metric("raas.serve_busy_s", 4.0, ts, component="solver-raas-0", node="solver-raas-0"))
    s = w.signals(now=120.0)
    assert s.demand == pytest.approx(1.0)  # (3.6 + 0.4) busy seconds every 4 s; the solver node's are not ours
    scaler = Scaler(1, 2, **SPEC)
    assert [scaler.decide(s, 1, now=now).action for now in (120, 121)] == ["hold", "up"]
