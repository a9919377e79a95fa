import pytest

from astraflow.topics import JobTopics, TopicConfigMismatch, TopicSpec, ensure_topics


def test_ensure_topics_is_idempotent_and_sets_configs(bootstrap, job_name):
    topics = JobTopics(job=job_name, policies=("solver", "verifier"), task_partitions=3)
    created = ensure_topics(bootstrap, topics.specs())
    assert sorted(created) == sorted(s.name for s in topics.specs())
    assert topics.tasks("solver") == f"af.{job_name}.tasks.solver"
    assert ensure_topics(bootstrap, topics.specs()) == []  # second call: verified, nothing created
    versions = next(s for s in topics.specs() if s.name == topics.versions)
    assert versions.cleanup_policy == "compact"


def test_partition_mismatch_names_topic_and_key(bootstrap, job_name):
    ensure_topics(bootstrap, [TopicSpec(f"af.{job_name}.x", partitions=2)])
    with pytest.raises(TopicConfigMismatch) as e:
        ensure_topics(bootstrap, [TopicSpec(f"af.{job_name}.x", partitions=4)])
    assert e.value.key == "partitions" and e.value.expected == 4 and e.value.actual == 2
    assert f"af.{job_name}.x" in str(e.value)


def test_config_mismatch_names_the_setting(bootstrap, job_name):
    ensure_topics(bootstrap, [TopicSpec(f"af.{job_name}.v", cleanup_policy="delete")])
    with pytest.raises(TopicConfigMismatch, match="cleanup.policy"):
        ensure_topics(bootstrap, [TopicSpec(f"af.{job_name}.v", cleanup_policy="compact")])
