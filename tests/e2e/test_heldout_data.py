"""A JSONL maths dataset job evaluates on its own held-out rows, which it never trains on.

The real dataflow actor publishes the job's training prompts and the real evaluator actor
measures version 0 on the real embedded broker. Each row carries a ``score`` column that a
metadata-reading reward returns as it stands, so the held-out accuracy is a function of
*which* rows were evaluated, whatever the tiny model writes: it must be the mean score of
exactly the file's rows the dataflow did not publish (arithmetic problems have no score
and would fail the reward; training rows would give another mean).
"""

from __future__ import annotations

import json
import time

import pytest

from astraflow.workflows.api import reward

N_ROWS = 30


@reward("test_heldout_row_score")
def row_score(completion_text: str, answer: str, meta) -> float:
    """The row's own ``score`` column: the accuracy says which rows were evaluated."""
    return float(meta["score"])


def _write_dataset(path) -> dict[str, float]:
    scores = {}
    with open(path, "w") as f:
        for i in range(N_ROWS):
            a, b = 10 + 3 * i, i % 9
            text = f"{a}+{b}="
            scores[text] = round((i + 1) / (N_ROWS + 1), 6)  # distinct: a mean names its rows
            f.write(json.dumps({"id": f"m{i}", "prompt": text, "answer": str(a + b), "score": scores[text],
                                "topic": "addition"}) + "\n")
    return scores


def _wait(pred, timeout: float, what: str, alive=lambda: True):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_jsonl_job_is_evaluated_on_its_own_heldout_rows_never_trained_on(bootstrap, make_job_config, tmp_path):
    from astraflow.actors.dataflow import DataflowActor
    from astraflow.actors.evaluator import EvaluatorActor, heldout_problems
    from astraflow.actors.signing import with_run_keys
    from astraflow.topics import Metric, Prompt, ensure_topics, job_topics
    from astraflow.topics.replay import read_topic

    scores = _write_dataset(tmp_path / "maths.jsonl")
    cfg = with_run_keys(make_job_config({"data": {"source": "maths.jsonl"},  # relative to the config file
                                         "workflow": {"params": {"reward": "test_heldout_row_score"}},
                                         "eval": {"holdout": 0.2, "split_seed": 7, "k": 1}}, name="heldout"),
                        tmp_path)
    topics = job_topics(cfg)
    ensure_topics(bootstrap, topics.specs())
    flow = DataflowActor.start(None, "dataflow", cfg, bootstrap)
    try:
        published = _wait(lambda: [m for _, _, m in read_topic(bootstrap, topics.prompts) if isinstance(m, Prompt)],
                          120, "the prompts", flow.is_alive)
    finally:
        if flow.is_alive():
            flow.stop()
    trained = {p.text for p in published}
    unpublished = set(scores) - trained
    # 20% of the 30 distinct prompts held out; every other row published, once
    assert len(unpublished) == 6 and len(published) == len(trained) == N_ROWS - 6
    assert all(p.metadata == {"score": scores[p.text], "topic": "addition"} for p in published)

    problems = heldout_problems(cfg)
    assert {p.text for p in problems} == unpublished  # exactly the held-out rows, with their metadata
    assert all(p.metadata["score"] == scores[p.text] for p in problems)
    assert heldout_problems(cfg) == problems  # fixed across calls (the dataflow and every evaluation)

    ev = EvaluatorActor.start(None, "evaluator", cfg, bootstrap)
    try:
        [acc] = _wait(lambda: [m for _, _, m in read_topic(bootstrap, topics.metrics)
                               if isinstance(m, Metric) and m.name == "eval.accuracy"], 180, "eval.accuracy",
                      ev.is_alive)
    finally:
        if ev.is_alive():
            ev.stop()
    assert acc.step == 0 and acc.labels["problems"] == 6
    assert acc.labels["heldout"] == "maths.jsonl holdout 0.2" and acc.labels["reward"] == "test_heldout_row_score"
    assert acc.value == pytest.approx(sum(scores[t] for t in unpublished) / 6)


@pytest.mark.slow
def test_a_jsonl_job_run_end_to_end_reports_accuracy_on_its_heldout_rows(bootstrap, make_job_config, tmp_path):
    """`astraflow run`'s path (launcher, node processes): the summary names the file's split,
    the prompts topic holds no held-out row, and the audit of the topics holds."""
    from astraflow.actors.heldout import heldout_problems
    from astraflow.chaos.invariants import audit
    from astraflow.launcher import run_job
    from astraflow.topics import Prompt, job_topics
    from astraflow.topics.replay import read_topic

    scores = _write_dataset(tmp_path / "maths.jsonl")
    cfg = make_job_config({"data": {"source": "maths.jsonl"}, "trainer": {"steps": 2}, "eval": {"k": 1}},
                          name="heldout-run")
    summary = run_job(cfg, bootstrap=bootstrap, run_dir=tmp_path / "run", progress=False, timeout_s=600)
    assert summary["heldout"] == "maths.jsonl holdout 0.1" and summary["error"] is None
    assert set(summary["accuracy_by_version"]) == {0, 2}
    topics = job_topics(cfg)
    published = {m.text for _, _, m in read_topic(bootstrap, topics.prompts) if isinstance(m, Prompt)}
    held = {p.text for p in heldout_problems(cfg)}
    assert len(held) == 3 and held == set(scores) - published
    report = audit(bootstrap, topics, cfg.policy, cfg.effective_staleness)
    assert report.ok, report.violations
