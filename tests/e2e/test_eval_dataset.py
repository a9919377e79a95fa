"""``eval.dataset``: the real evaluator actor measures GSM8K-100 and HumanEval items at its first
version, on the real broker, with SmolLM2's tokenizer and template (the ``smol_random`` model),
and emits them labelled with the set; the run's summary and last line carry them."""

from __future__ import annotations

import time


def test_the_evaluator_measures_the_named_sets_at_its_first_version(bootstrap, make_job_config, smol_random,
                                                                    tmp_path):
    from astraflow.actors.evaluator import EvaluatorActor
    from astraflow.actors.signing import with_run_keys
    from astraflow.cli.run import done_line
    from astraflow.run_outputs import _dataset_summary
    from astraflow.topics import Metric, ensure_topics, job_topics
    from astraflow.topics.replay import read_topic

    cfg = with_run_keys(make_job_config({"model": {"path": str(smol_random)},
                                         "eval": {"problems": 2, "k": 1, "dataset": ["gsm8k100", "humaneval"],
                                                  "dataset_problems": 3, "dataset_max_new_tokens": 6}},
                                        name="evalsets"), tmp_path)
    topics = job_topics(cfg)
    ensure_topics(bootstrap, topics.specs())
    ev = EvaluatorActor.start(None, "evaluator", cfg, bootstrap)

    def measured() -> list[Metric]:
        return [m for _, _, m in read_topic(bootstrap, topics.metrics)
                if isinstance(m, Metric) and m.name.startswith("eval.dataset_")]

    try:
        deadline = time.monotonic() + 240
        while len(got := measured()) < 4 and time.monotonic() < deadline and ev.is_alive():
            time.sleep(0.5)
    finally:
        if ev.is_alive():
            ev.stop()
    assert len(got) == 4, got
    by = {(m.name, m.labels["dataset"]): m for m in got}
    for name, reward in (("gsm8k100", "math_answer"), ("humaneval", "humaneval_tests")):
        acc, err = by[("eval.dataset_accuracy", name)], by[("eval.dataset_stderr", name)]
        assert acc.step == err.step == 0 and 0.0 <= acc.value <= 1.0 and err.value >= 0.0
        assert acc.labels == {"dataset": name, "problems": 3, "reward": reward, "max_new_tokens": 6}
    rows = [{"name": m.name, "value": m.value, "step": m.step, **{f"label.{k}": v for k, v in m.labels.items()}}
            for m in got]
    summary = _dataset_summary(rows)["dataset_accuracy_by_version"]
    assert set(summary) == {"gsm8k100", "humaneval"} and summary["gsm8k100"]["0"]["problems"] == 3
    line = done_line({"steps_trained": 0, "wall_s": 1.0, "accuracy_by_version": {0: 0.5},
                      "dataset_accuracy_by_version": summary}, "policy")
    assert f"; gsm8k100 v0:{by[('eval.dataset_accuracy', 'gsm8k100')].value:.3f}" in line and "; humaneval v0:" in line
