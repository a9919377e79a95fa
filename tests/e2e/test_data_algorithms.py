"""Every data algorithm at once in a real job, with the dataflow process SIGKILLed mid-run.

The restarted dataflow must hold exactly the algorithm state the log holds (the state
record committed with the offsets it covers, never memory), curators must have learnt
from every settled group exactly once, and the conservation audit must hold with
dynamic-sampling drops, replays, skipped prompts and passes over the prompts.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from astraflow.actors.ledger import read_state
from astraflow.algorithms.pipeline import digest
from astraflow.chaos.harness import JobHarness
from astraflow.topics import Batch, Task, TrajectoryGroup, ensure_topics, job_topics
from astraflow.topics.messages import DROP_REASONS, GroupDrop
from astraflow.topics.replay import read_topic

pytestmark = pytest.mark.slow

EVERYTHING = [
    {"name": "mixing", "sources": {"arithmetic": 0.75, "extra.jsonl": 0.25}},
    {"name": "curriculum", "levels": [1, 2], "min_groups": 4, "threshold": 0.3},
    "greso",
    {"name": "filter_solved", "alpha": 0.5, "threshold": 0.9},
    {"name": "dynamic_sampling", "oversample": 1.25},
    {"name": "replay", "ratio": 0.25},
    "edf",
]


def _learnt_groups(bootstrap, topics, policy) -> dict[str, list[TrajectoryGroup]]:
    """Per prompt, in pass order: the groups a curator must have learnt from (batched fresh,
    or dropped with a reason that settles an open task with samples)."""
    groups = {(p, o): g for p, o, g in read_topic(bootstrap, topics.trajectories) if isinstance(g, TrajectoryGroup)}
    settled = [g for _, _, b in read_topic(bootstrap, topics.batches(policy)) if isinstance(b, Batch)
               for i, g in enumerate(b.groups) if not b.is_replay(i)]
    settled += [groups[(d.source.partition, d.source.offset)]
                for _, _, d in read_topic(bootstrap, topics.drops(policy))
                if isinstance(d, GroupDrop) and DROP_REASONS[d.reason] and d.reason != "failed"]
    by_prompt: dict[str, list[TrajectoryGroup]] = defaultdict(list)
    for g in settled:
        by_prompt[g.prompt_id].append(g)

    def pass_of(g: TrajectoryGroup) -> int:  # t0000012-<prompt> in pass 0, t0000012.<pass>-<prompt> after
        head = g.task_id.split("-", 1)[0]
        return int(head.split(".")[1]) if "." in head else 0
    return {p: sorted(gs, key=pass_of) for p, gs in by_prompt.items()}


def test_every_algorithm_on_survives_a_dataflow_sigkill_and_conserves_every_group(make_job_config, bootstrap,
                                                                                   tmp_path):
    (tmp_path / "extra.jsonl").write_text("".join(f'{{"prompt": "{a}+{b}=", "answer": "{a + b}"}}\n'
                                                  for a, b in ((1, 2), (3, 4), (5, 1), (2, 2), (7, 1), (4, 4))))
    cfg = make_job_config({"data": {"num_prompts": 24, "max_digits": 2, "ops": "+"},
                           "dataflow": {"force_after_skips": 8, "algorithms": EVERYTHING},
                           "trainer": {"steps": 8, "engine": {"loss": "decoupled_ppo"}},
                           "eval": {"problems": 8, "k": 1}}, name="algos")
    topics = job_topics(cfg)
    ensure_topics(bootstrap, topics.specs())
    h = JobHarness(cfg, bootstrap, tmp_path / "run")
    try:
        for role, node in (("dataflow", "dataflow"), ("trainer", "trainer"), ("raas", "raas-0")):
            h.start(role, node)
        h.wait_for(lambda m: m.name == "trainer.samples" and m.step >= 3, 400, "trainer step 3")
        h.kill("dataflow")
        committed, _ = read_state(bootstrap, topics.dataflow_state(cfg.policy), cfg.policy)
        h.start("dataflow", "dataflow")
        resumed = h.wait_for(lambda m: m.name == "dataflow.resumed" and m.value > 0, 300, "dataflow resumed")
        h.wait_for(lambda m: m.name == "trainer.done", 600, "trainer.done")
        assert h.wait_exit("trainer", 60) == 0
        report = h.audit_until_settled()
    finally:
        h.stop_all()

    # the restarted dataflow holds the committed algorithm state, bit for bit
    assert committed.algorithms and resumed.labels["algorithms_digest"] == digest(committed.algorithms)

    assert report.ok, report.violations[:10]
    assert report.batches == cfg.trainer.steps
    assert report.replayed_groups == cfg.trainer.steps - 1  # round(0.25 * 4) per batch after the first
    assert report.batched_groups == 4 + 3 * (cfg.trainer.steps - 1)
    assert report.drops.get("zero_variance", 0) > 0  # the tiny model fails many prompts on every sample
    freed = sum(n for reason, n in report.drops.items() if DROP_REASONS[reason])
    assert report.tasks == report.batched_groups + freed  # nothing unneeded in flight at the end

    final, _ = read_state(bootstrap, topics.dataflow_state(cfg.policy), cfg.policy)
    algos = final.algorithms
    assert sum(algos["algorithms"]["mixing"]["scheduled"].values()) == report.tasks  # no task forgotten by a restart
    assert algos["skipped"]  # curators did skip prompts
    passes = (algos["considered"] - 1) // 30  # 30 prompts published; each pass re-reads them all
    assert passes >= 1 and final.prompt_epoch in (passes, passes + 1)
    # GRESO learnt from each settled group once: a prompt whose groups all lacked signal has a
    # streak of exactly their number; any other prompt a streak no longer than its trailing run
    streaks = algos["algorithms"]["greso"]["streaks"]
    for prompt, groups in _learnt_groups(bootstrap, topics, cfg.policy).items():
        flat = [len({s.reward for s in g.samples}) <= 1 for g in groups]
        trailing = len(flat) - (max(i for i, f in enumerate(flat) if not f) + 1 if not all(flat) else 0)
        z = streaks.get(prompt, [0, ""])[0]
        assert z == trailing if all(flat) else z <= len(flat), (prompt, z, flat)
    tasks = [m for _, _, m in read_topic(bootstrap, topics.tasks(cfg.policy)) if isinstance(m, Task)]
    assert {t.prompt_id.split("-")[0] for t in tasks} == {"arith", "extra"}  # both sources mixed in
