"""Where the Kafka jars come from, and how to run Kafka's own main classes.

Order of precedence: ``KAFKA_HOME`` (an existing Apache Kafka install, its ``libs/``),
else a per-user cache filled once by Maven from the ``pom.xml`` next to this file (the
broker, Kafka's tools and MirrorMaker 2, all on one classpath as in Kafka's own ``libs/``);
a cache filled from an older pom that lacks one of its direct dependencies is topped up.
This module knows nothing about brokers' lifecycles; see :mod:`.broker`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from .exceptions import KafkaRuntimeError

POM = Path(__file__).with_name("pom.xml")

#: Kafka's tools by their script names; the classes ship in the same jars as the broker.
TOOLS: dict[str, str] = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-dump-log": "kafka.tools.DumpLogSegments",
    "kafka-storage": "kafka.tools.StorageTool",
}


def cache_root() -> Path:
    """The project's cache dir (``$ASTRAFLOW_CACHE`` or ``~/.cache/astraflow``)."""
    return Path(os.environ.get("ASTRAFLOW_CACHE") or Path.home() / ".cache" / "astraflow")


def kafka_version() -> str:
    """The Kafka version pinned in the pom."""
    m = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    if not m:
        raise KafkaRuntimeError(f"{POM}: no <kafka.version> property")
    return m.group(1)


def find_java() -> str:
    """Path of a ``java`` executable (``$JAVA_HOME/bin/java`` first), or a clear error."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if not java:
        raise KafkaRuntimeError(
            "Java not found: the embedded Kafka broker needs Java 17+ on PATH or JAVA_HOME "
            "(or pass --bootstrap-servers to use an existing cluster)"
        )
    return java


def libs_dir(fetch: bool = True) -> Path:
    """The directory holding the Kafka jars, fetching them with Maven the first time."""
    home = os.environ.get("KAFKA_HOME")
    if home:
        libs = Path(home) / "libs"
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise KafkaRuntimeError(f"KAFKA_HOME={home}: no kafka_2.13-*.jar under {libs}")
        return libs
    libs = cache_root() / "kafka" / kafka_version() / "libs"
    if (libs / ".complete").exists() and not missing_artifacts(libs):
        return libs
    if not fetch:
        missing = missing_artifacts(libs) if (libs / ".complete").exists() else []
        raise KafkaRuntimeError(f"Kafka jars not fetched yet into {libs}"
                                + (f" (the pom now also needs {', '.join(missing)})" if missing else "")
                                + "; run `astraflow broker fetch`")
    mvn = shutil.which("mvn")
    if not mvn:
        raise KafkaRuntimeError(
            "Maven (`mvn`) is needed once to fetch Apache Kafka from Maven Central; install it, "
            "or set KAFKA_HOME to an existing Kafka install"
        )
    tmp = libs.with_name("libs.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run(
        [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
         f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise KafkaRuntimeError(f"mvn could not fetch Kafka {kafka_version()} (pom {POM}):\n{tail}")
    have = {p.name for p in libs.glob("*.jar")} if (libs / ".complete").exists() else set()
    fetched = {p.name for p in tmp.glob("*.jar")}
    if have and have <= fetched:
        # A cache filled from an older pom (e.g. before MirrorMaker 2's jars): add the new jars
        # one by one and leave the others in place, so a JVM starting meanwhile from
        # ``libs/*`` (another checkout's broker) never sees the directory missing.
        for name in sorted(fetched - have):
            shutil.copy2(tmp / name, libs / f".{name}.part")
            os.replace(libs / f".{name}.part", libs / name)
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        shutil.rmtree(libs, ignore_errors=True)
        tmp.rename(libs)
    (libs / ".complete").write_text(kafka_version())
    return libs


def pom_artifacts() -> list[str]:
    """The artifact ids the pom depends on directly (each ships as ``<id>-<version>.jar``)."""
    deps = re.findall(r"<dependency>(.*?)</dependency>", POM.read_text(), flags=re.S)
    return [m.group(1) for d in deps if (m := re.search(r"<artifactId>([^<]+)</artifactId>", d))]


def missing_artifacts(libs: Path) -> list[str]:
    """The pom's direct dependencies that have no jar in ``libs`` (a cache from an older pom)."""
    names = [p.name for p in libs.glob("*.jar")]
    return [a for a in pom_artifacts() if not any(re.fullmatch(rf"{re.escape(a)}-\d[^/]*\.jar", n) for n in names)]


def classpath() -> str:
    return str(libs_dir() / "*")


def java_command(main_class: str, args: list[str], *, heap: str = "256m",
                 jvm_opts: list[str] | None = None) -> list[str]:
    """argv running ``main_class`` from the Kafka jars."""
    return [find_java(), f"-Xmx{heap}", *(jvm_opts or []), "-cp", classpath(), main_class, *args]


def run_tool(tool: str, args: list[str], *, timeout: float | None = None, heap: str = "256m",
             check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's own tools (a name from :data:`TOOLS` or a main class)."""
    main_class = TOOLS.get(tool, tool)
    log4j = _quiet_log4j_config()
    cmd = java_command(main_class, args, heap=heap, jvm_opts=[f"-Dlog4j2.configurationFile={log4j}"])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise KafkaRuntimeError(f"{tool} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc


def _quiet_log4j_config() -> Path:
    """A log4j2 config for tools: warnings to stderr only, so stdout stays parseable."""
    path = cache_root() / "log4j2-tools.properties"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "status = error\n"
            "appender.err.type = Console\nappender.err.name = ERR\nappender.err.target = SYSTEM_ERR\n"
            "appender.err.layout.type = PatternLayout\nappender.err.layout.pattern = %p %m%n\n"
            "rootLogger.level = WARN\nrootLogger.appenderRef.err.ref = ERR\n"
        )
    return path
