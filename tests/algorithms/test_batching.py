"""Group filters and batch composers: DS drops, exact replay shares, EDF order, schedule sizing."""

from __future__ import annotations

from astraflow.algorithms import Candidate, TrainedGroup
from astraflow.topics import SourceOffset

from .helpers import group, pipeline


def test_dynamic_sampling_drops_groups_whose_rewards_are_all_equal():
    p = pipeline({"name": "dynamic_sampling"})
    assert p.verdict(group("t0", [1, 1, 1, 1])) == ("zero_variance", "dynamic_sampling")
    assert p.verdict(group("t1", [0, 0, 0, 0])) == ("zero_variance", "dynamic_sampling")
    assert p.verdict(group("t2", [0.5, 0.5, 0.5, 0.5])) == ("zero_variance", "dynamic_sampling")
    assert p.verdict(group("t3", [1, 0, 1, 1])) is None
    assert p.stats()["dynamic_sampling.zero_variance_frac"] == 0.75


def test_oversampling_widens_the_schedule_and_nothing_else_does():
    assert pipeline().fresh_until(5) == 20  # no algorithm: B per batch, as without the plug-in layer
    assert pipeline("dynamic_sampling", "greso", "edf").fresh_until(5) == 20
    assert pipeline({"name": "dynamic_sampling", "oversample": 1.5}).fresh_until(5) == 30
    assert pipeline({"name": "dynamic_sampling", "oversample": 1.3}).fresh_until(1) == 6  # ceil(5.2)
    # the horizon (what the batches take) is not over-sampled
    assert pipeline({"name": "dynamic_sampling", "oversample": 1.5}).fresh_until(5, oversampled=False) == 20


def _cands(groups, deadlines=None):
    return [Candidate(g.task_id, g, (deadlines or [0] * len(groups))[i], i) for i, g in enumerate(groups)]


def _run_batches(p, steps, B=4):
    """Compose ``steps`` batches from an endless supply of fresh groups; (fresh ids, replayed ids) per batch."""
    out, n = [], 0
    for k in range(steps):
        supply = [group(f"t{n + i:03d}", [1, 0, 0, 0]) for i in range(B)]
        plan = p.compose(k, _cands(supply))
        fresh = [c.group for c in plan.fresh[:plan.fresh_slots]]
        n += len(fresh)
        out.append(([g.task_id for g in fresh], [r.group.task_id for r in plan.replay]))
        p.trained(k, [TrainedGroup(g, SourceOffset("traj", 0, int(g.task_id[1:])), k) for g in fresh])
    return out


def test_replay_takes_exactly_its_share_of_every_batch_from_trained_groups():
    p = pipeline({"name": "replay", "ratio": 0.5}, B=4)
    batches = _run_batches(p, 8)
    assert batches[0] == (["t000", "t001", "t002", "t003"], [])  # nothing trained yet
    trained_fresh: list[str] = list(batches[0][0])
    for fresh, replayed in batches[1:]:
        assert (len(fresh), len(replayed)) == (2, 2)
        assert set(replayed) <= set(trained_fresh) and not set(replayed) & set(fresh)
        assert replayed == trained_fresh[-2:][::-1]  # recent: the newest trained groups first
        trained_fresh += fresh
    # the schedule sizes itself to what the batches take: 4 fresh, then 2 per batch
    assert [p.fresh_until(s) for s in range(5)] == [0, 4, 6, 8, 10]


def test_uniform_replay_draws_from_the_whole_buffer_reproducibly():
    spec = {"name": "replay", "ratio": 0.5, "capacity": 6, "sampling": "uniform"}
    a, b = _run_batches(pipeline(spec, seed=3), 12), _run_batches(pipeline(spec, seed=3), 12)
    assert a == b
    assert all(len(r) == 2 and len(set(r)) == 2 for _, r in a[1:])
    assert any(r != f[-2:] for (f, _), (_, r) in zip(a, a[1:]))  # not only the newest
    buffer = pipeline(spec).composers[0]
    assert buffer.capacity == 6


def test_replay_buffer_is_bounded_and_restored_from_trained_batches():
    p = pipeline({"name": "replay", "ratio": 0.25, "capacity": 5}, B=4)
    _run_batches(p, 6)
    replay = p.composers[0]
    assert len(replay.buffer) == 5 and replay.history == 2  # ceil(5 / 3 fresh per batch)
    q = pipeline({"name": "replay", "ratio": 0.25, "capacity": 5}, B=4)
    q.restore(list(replay.buffer))
    assert q.composers[0].buffer == replay.buffer


def test_edf_takes_the_groups_nearest_their_deadline_first():
    groups = [group(f"t{i}", [1, 0, 0, 0]) for i in range(5)]
    deadlines = [3, 2, 3, 2, 4]
    edf = pipeline("edf").compose(0, _cands(groups, deadlines))
    assert [c.group.task_id for c in edf.fresh[:edf.fresh_slots]] == ["t1", "t3", "t0", "t2"]
    fifo = pipeline("fifo").compose(0, _cands(groups, deadlines))
    assert [c.group.task_id for c in fifo.fresh[:fifo.fresh_slots]] == ["t0", "t1", "t2", "t3"]
    default = pipeline().compose(0, _cands(groups, deadlines))
    assert [c.group.task_id for c in default.fresh[:default.fresh_slots]] == ["t0", "t1", "t2", "t3"]
