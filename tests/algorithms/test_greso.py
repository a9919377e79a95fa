"""GRESO on crafted reward streams: the schedule probability, its adaptation, its state."""

from __future__ import annotations

import pytest

from astraflow.algorithms.greso import Greso, GresoParams

from .helpers import CTX, outcome, prompt

EASY, HARD, MIXED = [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]


def _greso(**params) -> Greso:
    return Greso(GresoParams(**params), CTX)


@pytest.mark.parametrize("stream, expected", [
    ([], 1.0),                         # never rolled out: z = 0 always schedules
    ([MIXED], 1.0),
    ([EASY], 0.5),                     # max(0.5 ** 1, 0.10)
    ([EASY] * 3, 0.125),               # max(0.5 ** 3, 0.10)
    ([EASY] * 4, 0.10),                # 0.0625 is under the easy floor
    ([HARD], 0.5),                     # max(0.5 ** 1, 0.40)
    ([HARD] * 2, 0.40),                # 0.25 is under the hard floor
    ([EASY, EASY, MIXED], 1.0),        # signal resets the streak
    ([EASY, EASY, HARD], 0.40),        # z = 3, the last group makes it hard: max(0.125, 0.40)
    ([[0.75] * 4], 0.5),                # equal non-binary rewards: zero variance; mean > 0.5 is easy
])
def test_schedule_probability_with_the_reference_defaults(stream, expected):
    g = _greso()
    for rewards in stream:
        g.update(outcome("p", rewards))
    assert g.schedule_probability("p") == pytest.approx(expected)


def test_decisions_follow_the_probability():
    g = _greso()
    for _ in range(3):
        g.update(outcome("easy3", EASY))
    g.update(outcome("hard2", HARD))
    g.update(outcome("hard2", HARD))
    n = 4000
    easy = sum(g.should_schedule(prompt("easy3"), 0) for _ in range(n)) / n
    hard = sum(g.should_schedule(prompt("hard2"), 0) for _ in range(n)) / n
    assert easy == pytest.approx(0.125, abs=0.02)
    assert hard == pytest.approx(0.40, abs=0.03)
    assert all(g.should_schedule(prompt("fresh"), 0) for _ in range(100))


def test_probabilities_move_towards_the_target_skip_shares_each_version():
    g = _greso()
    g.on_version(0)
    # 100 prompts considered, 10 skipped easy (0.10 > 0.083: skip less) and 10 hard (0.10 < 0.167: skip more)
    g.load_state({**g.state(), "window": {"considered": 100, "easy": 10, "hard": 10}})
    g.on_version(1)
    assert (g.p["easy"], g.p["hard"]) == (0.51, 0.49)
    g.on_version(2)  # no decision since version 1: nothing to steer by
    assert (g.p["easy"], g.p["hard"]) == (0.51, 0.49)
    g.on_version(2)  # the same version again moves nothing either
    g.load_state({**g.state(), "window": {"considered": 10, "easy": 0, "hard": 5}})
    g.on_version(3)
    assert (g.p["easy"], g.p["hard"]) == (0.50, 0.50)


def test_adaptation_is_clamped():
    g = _greso()
    g.load_state({**g.state(), "p": {"easy": 0.985, "hard": 0.015},
                  "window": {"considered": 10, "easy": 5, "hard": 0}})
    g.on_version(1)
    assert (g.p["easy"], g.p["hard"]) == (0.99, 0.01)
    g.load_state({**g.state(), "window": {"considered": 10, "easy": 5, "hard": 0}})
    g.on_version(2)
    assert (g.p["easy"], g.p["hard"]) == (0.99, 0.01)


def test_the_window_counts_the_skips_it_made():
    g = _greso()
    for pid, rewards in (("e", EASY), ("h", HARD)):
        for _ in range(5):
            g.update(outcome(pid, rewards))
    skipped = {"e": 0, "h": 0}
    for i in range(200):
        pid = "eh"[i % 2]
        skipped[pid] += not g.should_schedule(prompt(pid), 0)
    assert g.window == {"considered": 200, "easy": skipped["e"], "hard": skipped["h"]}
    g.on_version(1)
    # ~90 % of the easy ones skipped (floor 0.10): far above 0.083 of 200; ~60 % of hard ones: above 0.167
    assert skipped["e"] / 200 > 0.083 and skipped["h"] / 200 > 0.167
    assert (g.p["easy"], g.p["hard"]) == (0.51, 0.51)


def test_state_round_trip_reproduces_the_decisions():
    a = _greso()
    for rewards in ([EASY] * 2 + [HARD]):
        a.update(outcome("p", rewards))
    a.update(outcome("q", EASY))
    for _ in range(7):
        a.should_schedule(prompt("p"), 0)
    b = _greso()
    b.load_state(a.state())
    assert b.state() == a.state()
    assert [a.should_schedule(prompt(x), 0) for x in "pqpqpqpq"] == [b.should_schedule(prompt(x), 0) for x in "pqpqpqpq"]


@pytest.mark.parametrize("bad", [{"p0": 1.5}, {"step": 0.0}, {"p_min": 0.9, "p_max": 0.1}])
def test_bad_parameters_are_refused(bad):
    with pytest.raises(ValueError, match="greso"):
        GresoParams(**bad)
