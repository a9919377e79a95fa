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


def _replication(bootstrap, names):
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        factors = {t["name"]: tuple(sorted({len(p["replica_nodes"]) for p in t["partitions"]})) for t in admin.describe_topics(names)}
        cfgs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])["topic"]
        return {n: (factors[n], cfgs[n]["min.insync.replicas"]["value"]) for n in names}
    finally:
        admin.close()


def test_default_replication_follows_the_cluster(bootstrap, job_name):
    from astraflow.topics.cluster import replication_for
    assert [replication_for(n) for n in (1, 2, 3, 5)] == [(1, 1), (2, 1), (3, 2), (3, 2)]
    topics = JobTopics(job=job_name)
    ensure_topics(bootstrap, topics.specs())
    # one broker here: one copy, and an acks=all write needs only that one
    assert set(_replication(bootstrap, [topics.tasks("policy"), topics.trajectories]).values()) == {((1,), "1")}


def test_explicit_replication_is_created_and_verified(bootstrap, job_name):
    from astraflow.topics import TopicsError
    ensure_topics(bootstrap, JobTopics(job=job_name, replication_factor=1, min_insync_replicas=1).specs())
    with pytest.raises(TopicConfigMismatch, match="replication factor=1 but the job requires replication factor=2"):
        ensure_topics(bootstrap, JobTopics(job=job_name, replication_factor=2).specs())
    with pytest.raises(TopicsError, match="replication factor 2 but the cluster has 1 live broker"):
        ensure_topics(bootstrap, [TopicSpec(f"af.{job_name}.new", replication=2)])
    with pytest.raises(ValueError, match="min_insync_replicas must be between 1 and the replication factor"):
        TopicSpec(f"af.{job_name}.bad", replication=2, min_insync_replicas=3)


def test_consumer_groups_are_job_scoped():
    a, b = JobTopics(job="job-a", policies=("solver",)), JobTopics(job="job-b", policies=("solver",))
    assert a.rollout_group("solver") == "af.job-a.raas.solver"
    assert a.generation_group("solver") == "af.job-a.gen.solver"
    assert a.dataflow_group("solver") == "af.job-a.dataflow.solver"
    assert b.dataflow_group("solver") != a.dataflow_group("solver")
    # two jobs on one cluster with the same policy name never share a group (or rebalance each other)
    assert len({t.rollout_group("solver") for t in (a, b)} | {t.generation_group("solver") for t in (a, b)}) == 4
