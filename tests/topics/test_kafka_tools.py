"""Kafka's own tools, from the same jars as the broker, see what our wrappers write."""

import struct

import orjson

from astraflow.topics import TrajectoryGroup
from astraflow.topics.runtime import run_tool

from .samples import GROUP


def test_trajectory_record_is_plain_json_to_kafkas_console_consumer(job_topics, bootstrap, make_producer):
    make_producer().send_sync(job_topics.trajectories, GROUP, key=GROUP.task_id, partition=0)
    proc = run_tool("kafka-console-consumer", [
        "--bootstrap-server", bootstrap, "--topic", job_topics.trajectories, "--partition", "0",
        "--offset", "earliest", "--max-messages", "1", "--timeout-ms", "20000",
        "--property", "print.key=true", "--property", "key.separator=\t",
        "--property", "print.headers=true", "--property", "headers.separator=,",
    ], timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[0]
    headers, key, value = line.split("\t", 2)
    assert "af-type:trajectory-group" in headers
    assert key == "task-1"
    data = orjson.loads(value)  # a client that knows nothing of astraflow reads plain JSON
    assert data["task_id"] == "task-1"
    # number arrays are packed: the hex of little-endian int32 / float64 items, readable without astraflow
    tokens = bytes.fromhex(data["samples"][0]["tokens"])
    assert list(struct.unpack(f"<{len(tokens) // 4}i", tokens)) == [1, 2, 3]
    logprobs = bytes.fromhex(data["samples"][0]["logprobs"])
    assert list(struct.unpack(f"<{len(logprobs) // 8}d", logprobs)) == list(GROUP.samples[0].logprobs)
    assert TrajectoryGroup.TYPE == "trajectory-group"


def test_kafka_topics_tool_lists_the_job_topics(job_topics, bootstrap):
    proc = run_tool("kafka-topics", ["--bootstrap-server", bootstrap, "--describe",
                                     "--topic", job_topics.versions], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "cleanup.policy=compact" in proc.stdout
