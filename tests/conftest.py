"""Session fixtures: one real embedded Kafka broker for the whole test run.

Set ``ASTRAFLOW_TEST_BOOTSTRAP`` to run against an existing cluster instead.
Each test gets its own job name (so its own topics) through ``job_topics``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from astraflow.topics import Consumer, EmbeddedBroker, JobTopics, Producer, ensure_topics


#: The cached warm-started models much of the suite loads. On a machine whose model cache is
#: empty (a fresh CI machine) the first test to need one builds it while every other worker
#: that needs it waits on the build's lock: the verifier's warm start alone held all three
#: workers for ~6 minutes. The controller starts these builds in one background process when
#: the session starts, and the workers run other tests meanwhile.
PREBUILT_TASKS = ("arithmetic", "verifier")
_BUILD = "from astraflow.models.bootstrap import ensure_tiny_model\nfor t in {!r}: ensure_tiny_model(task=t)"


def pytest_configure(config):
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return  # an xdist worker, or a run without workers: the tests build what they need
    # A cached model costs this process a directory lookup; a missing one is built under the
    # cache's file lock, so a test that needs it before it is done waits for it, never builds it twice.
    config._af_prebuild = subprocess.Popen([sys.executable, "-c", _BUILD.format(PREBUILT_TASKS)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_unconfigure(config):
    build = getattr(config, "_af_prebuild", None)
    if build is not None and build.poll() is None:
        build.terminate()  # a run cut short: the lock dies with the process, the next build restarts
        build.wait(timeout=30)


@pytest.fixture(scope="session")
def kafka_broker():
    if os.environ.get("ASTRAFLOW_TEST_BOOTSTRAP"):
        yield None
        return
    broker = EmbeddedBroker(heap="768m").start()
    try:
        yield broker
    finally:
        broker.close()  # its temp data dir too: a test run must not leave ~1 GB of logs behind


@pytest.fixture(scope="session")
def bootstrap(kafka_broker) -> str:
    return os.environ.get("ASTRAFLOW_TEST_BOOTSTRAP") or kafka_broker.bootstrap_servers


@pytest.fixture
def group_members(bootstrap):
    """``members(group)``: the member ids the broker lists for a consumer group now."""
    from kafka import KafkaAdminClient

    def members(group: str) -> set[str]:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            return {m["member_id"] for m in admin.describe_groups([group])[group].get("members") or ()}
        finally:
            admin.close()
    return members


@pytest.fixture
def expel_silently(group_members):
    """``expel(consumer, group, timeout_s, pause_s)``: stop the consumer's heartbeats (the client
    still believes it is a member) and wait until the broker drops it from ``group``, as it does
    a member whose session expired; the member id it had."""
    def expel(consumer, group: str, timeout_s: float = 30.0, pause_s: float = 1.0) -> str:
        member = consumer.group_metadata().member_id
        consumer.raw._coordinator._disable_heartbeat()
        deadline = time.monotonic() + timeout_s
        while member in group_members(group):
            assert time.monotonic() < deadline, "the broker never expelled the silent member"
            time.sleep(pause_s)
        return member
    return expel


@pytest.fixture
def job_name() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def job_topics(bootstrap, job_name) -> JobTopics:
    topics = JobTopics(job=job_name, policies=("policy",), task_partitions=4, trajectory_partitions=2)
    ensure_topics(bootstrap, topics.specs())
    return topics


@pytest.fixture
def make_producer(bootstrap):
    made: list[Producer] = []

    def factory(**kw) -> Producer:
        p = Producer(bootstrap, **kw)
        made.append(p)
        return p

    yield factory
    for p in made:
        p.close(timeout=5)


@pytest.fixture
def make_consumer(bootstrap):
    made: list[Consumer] = []

    def factory(**kw) -> Consumer:
        kw.setdefault("consumer_timeout_ms", 10_000)
        c = Consumer(bootstrap, **kw)
        made.append(c)
        return c

    yield factory
    for c in made:
        try:
            c.close()
        except Exception:  # noqa: BLE001 - already closed by the test
            pass


@pytest.fixture(scope="session")
def secure_broker(tmp_path_factory):
    """A lone embedded broker secured like `astraflow broker start --secure`: SASL_SSL
    (SCRAM-SHA-512) with a CA made for it, ACLs enforced; ``.secure`` is its
    :class:`~astraflow.topics.secured.SecureSetup` (the super user's client setting)."""
    from astraflow.topics.secured import SecureSetup
    root = tmp_path_factory.mktemp("secure-kafka")
    broker = EmbeddedBroker(root / "data", heap="512m", startup_timeout=300,  # TLS start-up beside the suite
                            secure=SecureSetup.create(root / "secure")).start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def smol_random():
    """A 2-layer random-initialised Llama with SmolLM2-135M-Instruct's tokenizer, chat template and
    generation config (:func:`astraflow.models.pretrained.random_like`): the real model's token
    paths at a tiny model's cost. Cached in the model cache (built once per machine, ~15 s)."""
    from astraflow.models.bootstrap import cache_root
    from astraflow.models.pretrained import random_like
    return random_like("smollm2-135m-instruct", cache_root())
