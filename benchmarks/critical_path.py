"""Where the time goes between two batches of an async run: the path the trainer waits on.

With ``max_staleness = s`` the tasks of batch ``k`` are scheduled once version ``k - s`` is
announced and rolled out with it, so batch ``k`` is ready

    publish (version ``k - s`` trained → announced) → schedule (announced → its tasks written)
    → to rollout (tasks written → the first rollout starts: commit, the node's poll, its weights)
    → rollout (first start → last finish) → batch (last finish → the batch written)

after the step that made version ``k - s``; the trainer meanwhile trains the ``s`` batches
before it. ``pickup`` (batch written → its training starts) is the trainer's side: the time it
still spent on earlier steps, or its own poll when it was waiting.

Read after the run from the job's own records (every time is this machine's clock): the
announcements and their record timestamps on ``versions``, task records on ``tasks.<policy>``,
each group's ``started_at`` / ``finished_at``, batch records, and the trainer's metrics (a
step's ``trainer.handed_off`` is emitted as the step hands its weights to the publisher, before
its checkpoint, and is taken as no later than the version's announcement; ``trainer.samples``
comes after the checkpoint, so a run whose trainer checkpoints every step would read the
checkpoint's time as a negative publish stage).
"""

from __future__ import annotations

from pathlib import Path
from statistics import median

from astraflow.benchmarks.lib.run_metrics import read_rows
from astraflow.config import JobConfig
from astraflow.topics import Batch, Task, TrajectoryGroup, VersionAnnouncement, job_topics
from astraflow.topics.replay import read_topic

STAGES = ("publish_s", "schedule_s", "to_rollout_s", "rollout_s", "batch_s", "pickup_s")
#: the stages of one batch's ``path_s`` (publish → batch written); pickup is the trainer's side
PATH_STAGES = STAGES[:-1]


def batch_paths(bootstrap: str, cfg: JobConfig, run_dir: Path, first_step: int = 3) -> list[dict]:
    """One row per batch ``k >= first_step`` (start-up excluded): each stage in seconds, and
    the batch's ``path_s`` (the sum of its :data:`PATH_STAGES`)."""
    topics, policy = job_topics(cfg), cfg.policy
    announced: dict[int, float] = {}
    for _, _, ts, m in read_topic(bootstrap, topics.versions, timestamps=True):
        if isinstance(m, VersionAnnouncement) and m.policy == policy:
            announced.setdefault(m.version, ts / 1000)  # the first (delta) announcement of a version
    tasks = {m.task_id: (m.scheduled_version, ts / 1000)
             for _, _, ts, m in read_topic(bootstrap, topics.tasks(policy), timestamps=True) if isinstance(m, Task)}
    groups = {m.task_id: m for _, _, m in read_topic(bootstrap, topics.trajectories)
              if isinstance(m, TrajectoryGroup) and m.policy == policy}
    batches = {m.step: (ts / 1000, m) for _, _, ts, m in read_topic(bootstrap, topics.batches(policy), timestamps=True)
               if isinstance(m, Batch)}
    rows = read_rows(run_dir)
    # trainer.handed_off at step v is stamped just after the step that made version v hands it
    # to the publisher. The trainer's thread runs niced and the publisher's threads do not, so
    # on a busy machine the publisher can announce v before the trainer's thread is scheduled
    # again to stamp it (a run read publish_s <= -13 ms): the hand-off was no later than the
    # announcement, so that bounds it.
    handed_off = {int(r["step"]): r["ts"] for r in rows if r["name"] == "trainer.handed_off"}
    handed_off = {v: min(ts, announced.get(v, ts)) for v, ts in handed_off.items()}
    train_s = {int(r["step"]) - 1: r["value"] for r in rows if r["name"] == "trainer.train_s"}
    out = []
    for k in sorted(batches):
        written, batch = batches[k]
        ids = [g.task_id for i, g in enumerate(batch.groups) if not batch.is_replay(i)]
        if k < first_step or k not in train_s or k + 1 not in handed_off or not ids or \
                any(i not in tasks or i not in groups for i in ids):
            continue
        v = min(tasks[i][0] for i in ids)
        if v not in announced or v not in handed_off:
            continue
        scheduled = min(tasks[i][1] for i in ids)
        started = min(groups[i].started_at for i in ids)
        finished = max(groups[i].finished_at for i in ids)
        # the oldest weights any trained token came from (what the staleness bound holds; a task
        # can roll out on newer weights than it was scheduled at)
        token_v = min((min(sm.versions) for i in ids for sm in groups[i].samples if sm.versions), default=v)
        out.append({"step": k, "version": v, "token_version": token_v,
                    "publish_s": announced[v] - handed_off[v], "schedule_s": scheduled - announced[v],
                    "to_rollout_s": started - scheduled, "rollout_s": finished - started,
                    "batch_s": written - finished,
                    "pickup_s": handed_off[k + 1] - train_s[k] - written})
        out[-1]["path_s"] = sum(out[-1][s] for s in PATH_STAGES)
    return out


def summarize(paths: list[dict]) -> dict:
    """Median of each stage and of each batch's whole path (publish → batch written) over the
    batches. Medians of different stages come from different batches, so they do not add up:
    compare stages within a row of :func:`batch_paths`, not across these medians."""
    if not paths:
        return {"batches": 0}
    out: dict = {stage: median(p[stage] for p in paths) for stage in STAGES}
    out["path_s"] = median(p["path_s"] for p in paths)
    out["batches"] = len(paths)
    return out
