import socket
from pathlib import Path

import pytest

from astraflow.topics import BrokerStartError, EmbeddedBroker
from astraflow.topics import runtime


def test_port_taken_gives_a_clear_error_quoting_the_log(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        broker = EmbeddedBroker(tmp_path / "data", port=port, heap="256m", startup_timeout=60)
        with pytest.raises(BrokerStartError) as e:
            broker.start()
    msg = str(e.value)
    assert str(port) in msg
    assert "Address already in use" in msg  # quoted from the broker's own log
    assert broker.pid is None  # no JVM left behind


def test_a_self_chosen_port_taken_before_the_jvm_binds_it_is_chosen_again(tmp_path):
    """A free port is free when chosen, not when the JVM binds it: a broker that chose its ports
    itself and lost both (another process bound them in between) chooses again and starts,
    formatting its fresh dir again for the new controller port; an explicit port is not changed
    (the test above)."""
    from kafka import KafkaAdminClient
    broker = EmbeddedBroker(tmp_path / "data", heap="256m", startup_timeout=90)
    lost = (broker.port, broker.controller_port)
    with socket.socket() as a, socket.socket() as b:
        for s, port in ((a, lost[0]), (b, lost[1])):
            s.bind(("127.0.0.1", port))
            s.listen(1)
        broker.start()
    try:
        assert broker.port != lost[0] and broker.controller_port != lost[1]
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)  # a real broker answers there
        admin.list_topics()
        admin.close()
    finally:
        broker.close()


def test_the_cli_shows_the_brokers_log_above_its_one_line_cause(tmp_path):
    """``astraflow broker start`` on a taken port: the log lines saying why come before the last
    line, which is the cause (what a user and a launcher read)."""
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "astraflow", "broker", "start", "--port", str(port), "--heap", "256m",
                            "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0
    assert lines[-1].startswith("astraflow: error: Kafka broker exited") and str(port) in lines[-1]
    assert any("Address already in use" in line for line in lines[:-1])


def test_no_java_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no java on it
    with pytest.raises(BrokerStartError, match="Java not found.*Java 17"):
        EmbeddedBroker(tmp_path / "data").start()


def test_kafka_home_without_jars_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_HOME", str(tmp_path))
    with pytest.raises(runtime.KafkaRuntimeError, match="KAFKA_HOME"):
        runtime.libs_dir()


def test_a_broker_deletes_the_temp_dir_it_made_but_keeps_a_named_one(tmp_path):
    with EmbeddedBroker(heap="256m", startup_timeout=90) as own:
        made = own.data_dir
        assert (made / "meta" / "meta.properties").exists()
    assert not made.exists()  # a test run or benchmark must not leave its logs in /tmp
    named = tmp_path / "kept"
    with EmbeddedBroker(named, heap="256m", startup_timeout=90):
        pass
    assert (named / "meta" / "meta.properties").exists()  # a named dir is the user's log: restart / replay


def test_weight_chunks_are_not_humongous_objects_in_the_brokers_heap(kafka_broker, job_topics, make_producer):
    """Every weight chunk is a 1 MiB record. With G1's default 1 MiB regions (heaps < 2 GiB)
    each was a humongous allocation, and those drove the broker's GC to ~0.1 CPU s per trained
    step: the embedded broker runs G1 with 16 MiB regions, and logs its collections."""
    if kafka_broker is None:
        pytest.skip("an external broker (ASTRAFLOW_TEST_BOOTSTRAP): its JVM is not ours")
    from astraflow.topics import ChunkWriter

    def humongous_starts() -> list[str]:  # collections a humongous allocation started
        return [line for line in kafka_broker.gc_log_path.read_text().splitlines() if "Humongous" in line]

    before = humongous_starts()
    producer = make_producer(client_id="chunks", compression_type=None)
    writer = ChunkWriter(producer, job_topics.weights("policy"), key="1", object_id="gc-test")
    for i in range(160):  # past G1's initial occupancy threshold had each chunk gone to the old generation
        writer.write(bytes([i]) * (1 << 20))
    writer.close()
    log = kafka_broker.gc_log_path.read_text()
    assert "Heap Region Size: 16M" in log, log[:2000]
    assert humongous_starts() == before


def test_the_brokers_jvm_compiles_with_c1_only(kafka_broker):
    """C2 recompiling the broker's hot paths took half of the broker's CPU forty seconds into a
    demo run: the embedded broker's JVM runs C1 alone (HotSpot names its compiler threads by
    compiler)."""
    if kafka_broker is None:
        pytest.skip("an external broker (ASTRAFLOW_TEST_BOOTSTRAP): its JVM is not ours")
    names = [(t / "comm").read_text().strip() for t in Path(f"/proc/{kafka_broker.pid}/task").iterdir()]
    compilers = sorted(n for n in names if "CompilerThre" in n)
    assert compilers and all(n.startswith("C1 ") for n in compilers), compilers


def test_a_jar_cache_from_an_older_pom_is_topped_up_in_place(tmp_path, monkeypatch):
    """A cache filled before the pom named MirrorMaker 2's jars: ``astraflow broker fetch`` adds
    them next to the others, whose files stay as they were (a broker starting from ``libs/*``
    meanwhile never sees the directory missing)."""
    import os
    import shutil

    if shutil.which("mvn") is None:
        pytest.skip("Maven is not installed")
    real = runtime.libs_dir()
    monkeypatch.delenv("KAFKA_HOME", raising=False)
    monkeypatch.setenv("ASTRAFLOW_CACHE", str(tmp_path))
    old = tmp_path / "kafka" / runtime.kafka_version() / "libs"
    old.mkdir(parents=True)
    for jar in real.glob("*.jar"):
        if not jar.name.startswith("connect-mirror"):
            os.link(jar, old / jar.name)  # as an older pom left it
    (old / ".complete").write_text(runtime.kafka_version())
    kept = (old / f"kafka-clients-{runtime.kafka_version()}.jar").stat().st_ino
    assert runtime.missing_artifacts(old) == ["connect-mirror", "connect-mirror-client"]
    with pytest.raises(runtime.KafkaRuntimeError, match="also needs connect-mirror, connect-mirror-client"):
        runtime.libs_dir(fetch=False)
    assert runtime.libs_dir() == old
    assert runtime.missing_artifacts(old) == []
    assert (old / f"kafka-clients-{runtime.kafka_version()}.jar").stat().st_ino == kept
    assert sorted(p.name for p in old.glob("*.jar")) == sorted(p.name for p in real.glob("*.jar"))
