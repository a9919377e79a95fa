"""Bounding a run dir: ``kafka.retention`` reaches the topics, ``astraflow runs prune`` removes what it says."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest

from astraflow.config import ConfigError, RetentionConfig, load_config
from astraflow.runs import PruneError, find_runs, parse_age, prune
from astraflow.topics import job_topics
from astraflow.topics.registry import RETENTION_FAMILIES


def _job(tmp_path, kafka: str):
    path = tmp_path / "job.yaml"
    path.write_text(f"job: j\nkafka:\n{kafka}")
    return path


def test_retention_limits_reach_their_topic_family_only(tmp_path):
    assert tuple(f.name for f in dataclasses.fields(RetentionConfig)) == RETENTION_FAMILIES
    default = {s.name: s for s in job_topics(load_config(_job(tmp_path, "  task_partitions: 8\n"))).specs()}
    cfg = load_config(_job(tmp_path, "  retention:\n    metrics: {ms: 3600000}\n"
                                     "    trajectories: {bytes: 1073741824}\n"))
    specs = {s.name: s for s in job_topics(cfg).specs()}
    assert (specs["af.j.metrics"].retention_ms, specs["af.j.metrics"].retention_bytes) == (3_600_000, -1)
    assert (specs["af.j.trajectories"].retention_ms, specs["af.j.trajectories"].retention_bytes) == (-1, 2**30)
    changed = {n for n in specs if specs[n] != default[n]}
    assert changed == {"af.j.metrics", "af.j.trajectories"}


@pytest.mark.parametrize("kafka,words", [
    ("  retention:\n    metrics: {ms: 100}\n", "kafka.retention.metrics.ms must be -1 (never delete) or >= 60000"),
    ("  retention:\n    batches: {bytes: 5}\n", "kafka.retention.batches.bytes must be -1 (unbounded) or >= 1048576"),
    ("  retention:\n    weights: {ms: 100000}\n", "kafka.retention.weights: unknown key"),
    ("  retention:\n    dlq: {ms: -7}\n", "kafka.retention.dlq.ms"),
])
def test_bad_retention_is_an_error_naming_the_key_and_file(tmp_path, kafka, words):
    path = _job(tmp_path, kafka)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert words in str(e.value) and str(path) in str(e.value)


def _run(root, name: str, age_s: float, now: float):
    d = root / name
    (d / "kafka" / "meta").mkdir(parents=True)
    (d / "kafka" / "meta" / "segment.log").write_bytes(b"x" * 4096)
    (d / "checkpoints").mkdir()
    (d / "hf" / "policy" / "v1").mkdir(parents=True)
    (d / "summary.json").write_text("{}")
    os.utime(d / "summary.json", (now - age_s, now - age_s))
    return d


def test_prune_keeps_the_newest_or_the_young_and_kafka_only_keeps_the_model(tmp_path):
    now = time.time()
    root = tmp_path / "runs"
    old, mid, new = (_run(root, n, a, now) for n, a in (("old", 30 * 86_400, ), ("mid", 2 * 86_400), ("new", 60)))
    (root / "not-a-run").mkdir()
    assert [r.path for r in find_runs(root)] == [new, mid, old]

    listed = prune(root, keep=1, dry_run=True, now=now)
    assert [p for p, _ in listed] == [mid, old] and old.exists() and mid.exists()
    removed = prune(root, older_than_s=parse_age("7d"), kafka_only=True, now=now)
    assert [p for p, _ in removed] == [old / "kafka", old / "checkpoints"] and removed[0][1] == 4096
    assert (old / "hf" / "policy" / "v1").is_dir() and (old / "summary.json").exists() and (mid / "kafka").exists()
    prune(root, keep=1, now=now)
    assert not old.exists() and not mid.exists() and new.exists() and (root / "not-a-run").exists()


@pytest.mark.parametrize("kw,words", [({}, "give one of --keep N or --older-than D"),
                                      ({"keep": -1}, "--keep -1: must be >= 0")])
def test_prune_refuses_unclear_requests(tmp_path, kw, words):
    with pytest.raises(PruneError, match=words):
        prune(tmp_path, **kw)
    with pytest.raises(PruneError, match="expected a number and a unit"):
        parse_age("7 days")
