"""SIGKILL the real trainer process inside checkpoint saves and behind its announced head.

The checkpoint store's test hook (``PAUSE_ENV``) makes every save of that trainer pause
after the engine wrote its files, before the checkpoint is published, so a kill lands
inside a save deterministically: the test waits for the ``step_N.partial`` directory.
"""

from __future__ import annotations

import time

import pytest

from astraflow.chaos.harness import JobHarness
from astraflow.engines.checkpoints import PAUSE_ENV, CheckpointStore
from astraflow.topics import Heartbeat, VersionAnnouncement, ensure_topics, job_topics
from astraflow.topics.replay import read_topic
from astraflow.weights import read_latest_announcement

pytestmark = pytest.mark.slow


def _start(cfg, bootstrap, tmp_path, raas: int) -> JobHarness:
    ensure_topics(bootstrap, job_topics(cfg).specs())
    h = JobHarness(cfg, bootstrap, tmp_path / "run")
    h.start("dataflow", "dataflow")
    for i in range(raas):
        h.start("raas", f"raas-{i}")
    return h


def _start_trainer(h: JobHarness, monkeypatch, pause: str = "") -> float:
    """Start the trainer, its saves pausing as ``pause`` says (``PAUSE_ENV``); returns the start time."""
    with monkeypatch.context() as m:
        if pause:
            m.setenv(PAUSE_ENV, pause)
        else:
            m.delenv(PAUSE_ENV, raising=False)
        started = time.time()
        h.start("trainer", "trainer")
    return started


def _saving(store: CheckpointStore, at_least: int, timeout: float = 300) -> int:
    """Wait until the trainer is inside the save of a step >= ``at_least``; returns that step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [int(p.name[5:-8]) for p in store.root.glob("step_*.partial")] if store.root.exists() else []
        if steps and max(steps) >= at_least:
            return max(steps)
        time.sleep(0.05)
    raise TimeoutError(f"the trainer did not start saving step >= {at_least} within {timeout:.0f}s")


def _resumed(h: JobHarness, since: float):
    return h.wait_for(lambda m: m.name == "trainer.resumed_step" and m.ts >= since, 300, "trainer.resumed_step")


def _assert_trained_once_in_order(store: CheckpointStore, steps: int) -> None:
    lineage = store.latest().state["lineage"]
    assert [step for step, _ in lineage] == list(range(steps))  # no batch twice, none skipped
    offsets = [off for _, off in lineage]
    assert offsets == sorted(set(offsets))


def test_trainer_killed_inside_checkpoint_saves_resumes_from_the_previous_one(
        make_job_config, bootstrap, tmp_path, monkeypatch):
    cfg = make_job_config({"trainer": {"steps": 6, "checkpoint_every": 1, "keep_checkpoints": 2}},
                          name="ckpt-kill")
    h = _start(cfg, bootstrap, tmp_path, raas=1)
    store = CheckpointStore(tmp_path / "run" / "checkpoints" / cfg.policy)
    resumed_at = []
    try:
        _start_trainer(h, monkeypatch, "4")
        resume_step = 0
        for _ in range(2):
            saving = _saving(store, at_least=resume_step + 2)  # a step past the resume point: progress
            h.kill("trainer")
            published = store.latest()
            assert published is not None and published.step == saving - 1  # never the half-written one
            resume_step = int(_resumed(h, _start_trainer(h, monkeypatch, "4")).value)
            resumed_at.append((saving, resume_step))
            assert resume_step == published.step
        done = h.wait_for(lambda m: m.name == "trainer.done", 600, "trainer.done")
        assert h.wait_exit("trainer", 60) == 0
        _assert_trained_once_in_order(store, cfg.trainer.steps)
        assert sorted(p.name for p in store.root.glob("step_*")) == ["step_00000005", "step_00000006"]

        # The final checkpoint is usable: a restarted trainer loads it, holds exactly the
        # weights it announced last, and has nothing left to publish or train.
        restarted = _start_trainer(h, monkeypatch)
        assert _resumed(h, restarted).value == cfg.trainer.steps
        again = h.wait_for(lambda m: m.name == "trainer.done" and m.ts >= restarted, 300, "second trainer.done")
        assert h.wait_exit("trainer", 60) == 0
    finally:
        h.stop_all()
    assert [s - r for s, r in resumed_at] == [1, 1] and resumed_at[-1][1] >= 2
    head = read_latest_announcement(bootstrap, h.topics.versions, cfg.policy)
    assert head.version == cfg.trainer.steps
    assert again.labels["weights_digest"] == done.labels["weights_digest"] == head.checksum
    assert again.labels["epoch"] == head.epoch  # resuming at the announced head keeps the lineage


def test_trainer_resumed_behind_its_announced_head_moves_every_node_to_a_new_epoch(
        make_job_config, bootstrap, tmp_path, monkeypatch):
    cfg = make_job_config({"trainer": {"steps": 10, "checkpoint_every": 4}}, name="lineage")
    h = _start(cfg, bootstrap, tmp_path, raas=2)
    store = CheckpointStore(tmp_path / "run" / "checkpoints" / cfg.policy)
    nodes = {"raas-0", "raas-1"}
    try:
        # Paused inside the save of step 8: checkpoint 4 is the newest, versions up to 7 go out.
        _start_trainer(h, monkeypatch, "300@8")
        _saving(store, at_least=8)
        deadline = time.monotonic() + 60
        while (read_latest_announcement(bootstrap, h.topics.versions, cfg.policy).version < 6
               and time.monotonic() < deadline):
            time.sleep(0.5)
        h.kill("trainer")
        before = read_latest_announcement(bootstrap, h.topics.versions, cfg.policy)
        assert store.latest().step == 4 and before.version >= 6 and before.epoch == 0
        resumed = _resumed(h, _start_trainer(h, monkeypatch))
        assert (resumed.value, resumed.labels["epoch"]) == (4, 1)
        done = h.wait_for(lambda m: m.name == "trainer.done", 600, "trainer.done")
        assert h.wait_exit("trainer", 60) == 0
        final = done.labels["weights_digest"]
        evaluated = h.wait_for(lambda m: m.name == "eval.accuracy" and m.step == cfg.trainer.steps, 300,
                               "final evaluation")

        # Every RaaS node ends up rolling out with the trainer's final weights of the new epoch.
        deadline = time.monotonic() + 120
        while True:
            last = {hb.node_id: hb for _, _, hb in read_topic(bootstrap, h.topics.control)
                    if isinstance(hb, Heartbeat) and hb.node_id in nodes}
            held = {n: (hb.epoch, hb.version, hb.weights_digest) for n, hb in last.items()}
            if held == {n: (1, cfg.trainer.steps, final) for n in nodes} or time.monotonic() > deadline:
                break
            time.sleep(1)
    finally:
        h.stop_all()
    assert held == {n: (1, cfg.trainer.steps, final) for n in nodes}
    assert (evaluated.labels["epoch"], evaluated.labels["weights_digest"]) == (1, final)
    _assert_trained_once_in_order(store, cfg.trainer.steps)

    anns = [m for _, _, m in read_topic(bootstrap, h.topics.versions) if isinstance(m, VersionAnnouncement)]
    assert [a.epoch for a in anns] == sorted(a.epoch for a in anns)  # the old epoch never announced again
    new = [a for a in anns if a.epoch == 1]
    assert (new[0].version, new[0].kind) == (4, "snapshot")  # the resumed checkpoint, as a snapshot
    versions = [a.version for a in new]
    assert sorted(set(versions)) == list(range(4, cfg.trainer.steps + 1)) and versions == sorted(versions)
    assert (new[-1].version, new[-1].checksum) == (cfg.trainer.steps, final)
