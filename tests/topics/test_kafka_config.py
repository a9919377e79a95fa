"""The job config's ``kafka`` section: replication and transaction timeout, checked at load time."""

import pytest
import yaml

from astraflow.topics import job_topics
from astraflow.config import ConfigError, load_config


def _load(tmp_path, kafka: dict):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"job": "j", "kafka": kafka}))
    return load_config(path)


def test_defaults_leave_replication_to_the_cluster_and_bound_open_transactions(tmp_path):
    cfg = _load(tmp_path, {})
    assert (cfg.kafka.replication_factor, cfg.kafka.min_insync_replicas) == (None, None)
    assert cfg.kafka.transaction_timeout_ms == 30_000
    assert {(s.replication, s.min_insync_replicas) for s in job_topics(cfg).specs()} == {(None, None)}


def test_replication_settings_reach_every_topic(tmp_path):
    cfg = _load(tmp_path, {"replication_factor": 3, "min_insync_replicas": 2})
    assert {(s.replication, s.configs()["min.insync.replicas"]) for s in job_topics(cfg).specs()} == {(3, "2")}


@pytest.mark.parametrize("kafka, problem", [
    ({"replication_factor": 0}, r"kafka.replication_factor: must be in \[1, 100\], got 0"),
    ({"replication_factor": 2, "min_insync_replicas": 3}, "kafka.min_insync_replicas must be between 1 and"),
    ({"min_insync_replicas": 0}, r"kafka.min_insync_replicas: must be in \[1, 100\], got 0"),
    ({"transaction_timeout_ms": 1_000_000}, "transaction.max.timeout.ms"),
])
def test_bad_values_name_the_key(tmp_path, kafka, problem):
    with pytest.raises(ConfigError, match=problem) as e:
        _load(tmp_path, kafka)
    assert str(tmp_path / "job.yaml") in str(e.value)
