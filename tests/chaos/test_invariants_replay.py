"""The audit with replay and algorithm drops: a replay-marked group may be in several
batches, only after the batch that trained it; every other double appearance fails."""

from __future__ import annotations

import dataclasses

from astraflow.chaos.invariants import JobLog, check
from astraflow.topics import Batch, SourceOffset

from .test_invariants import TOPIC, _group, consistent_log


def _replay_log() -> JobLog:
    """The consistent log plus batch 2: t5 (now fresh, version 1) and t0 replayed from batch 0."""
    log = consistent_log()
    t0, t5 = log.groups[0][2], log.groups[5][2]
    log.groups[5] = (1, 1, _group("t5", version=1))
    log.drops = [d for d in log.drops if d.task_id != "t5"]
    log.batches.append(Batch("policy", 2, [log.groups[5][2], t0],
                             [SourceOffset(TOPIC, 1, 1), SourceOffset(TOPIC, 0, 0)], replay=[False, True]))
    log.state = dataclasses.replace(log.state, next_step=3, groups_dropped=1)
    assert t5.task_id == "t5"
    return log


def test_a_replayed_group_in_a_later_batch_passes_and_is_exempt_from_the_staleness_bound():
    log = _replay_log()
    report = check(log, max_staleness=1)  # t0 has version-0 tokens at step 2: stale, but a replay
    assert report.ok, report.violations
    assert (report.batched_groups, report.replayed_groups) == (5, 1)


def test_the_same_group_unmarked_in_a_second_batch_still_fails():
    log = _replay_log()
    last = log.batches[-1]
    log.batches[-1] = dataclasses.replace(last, replay=[False, False])
    report = check(log, max_staleness=5)
    assert any("t0 at trajectories[0]@0 is settled 2 times: batch 0, batch 2" in v for v in report.violations)


def test_a_replay_of_a_group_no_batch_trained_fails():
    log = _replay_log()
    failed = log.groups[2][2]  # t2 failed and was dropped: it was never trained
    last = log.batches[-1]
    log.batches[-1] = dataclasses.replace(last, groups=[last.groups[0], failed],
                                          sources=[last.sources[0], SourceOffset(TOPIC, 0, 2)])
    report = check(log, max_staleness=5)
    assert any("t2 at (0, 2) is marked as a replay but no earlier batch trained it" in v
               for v in report.violations), report.violations


def test_a_replay_in_the_batch_that_trains_the_group_fresh_fails():
    log = _replay_log()
    last = log.batches[-1]
    log.batches[-1] = dataclasses.replace(last, groups=[last.groups[0], last.groups[0]],
                                          sources=[last.sources[0], last.sources[0]])
    report = check(log, max_staleness=5)
    assert any("t5 at (1, 1) is marked as a replay but no earlier batch trained it" in v
               for v in report.violations), report.violations


def test_replay_marks_must_cover_every_group():
    log = _replay_log()
    log.batches[-1] = dataclasses.replace(log.batches[-1], replay=[True])
    assert any("2 groups but 1 replay marks" in v for v in check(log, max_staleness=5).violations)


def test_algorithm_drops_are_settlements_and_free_slots_as_declared():
    log = consistent_log()
    # t5 dropped by dynamic sampling instead of as stale: frees a slot all the same
    log.drops[1] = dataclasses.replace(log.drops[1], reason="zero_variance", detail="dropped by dynamic_sampling")
    report = check(log, max_staleness=1)
    assert report.ok, report.violations
    assert report.drops == {"failed": 1, "zero_variance": 1}
    log.state = dataclasses.replace(log.state, groups_dropped=1)  # a restart that forgot the slot it freed
    assert "dataflow state says 1 slots freed by drops, the log shows 2" in check(log, max_staleness=1).violations
