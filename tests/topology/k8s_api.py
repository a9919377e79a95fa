"""fabric8's mock Kubernetes API server for the Kubernetes backend's tests: built once, started per module.

A **stand-in for the Kubernetes API, not a cluster**: ``io.fabric8:kubernetes-server-mock``
in CRUD mode stores and serves objects (create, get, list by label selector, merge patches,
the ``scale`` subresource, ``resourceVersion`` conflicts, delete), but runs no controller,
scheduler or kubelet — a Deployment's replicas become pods only if the test makes them.
No real API server can be had on this machine (no images, no binary downloads).

The jars come from Maven Central through ``tools/k8s_mock/pom.xml`` (``mvn
dependency:copy-dependencies``, as the Kafka broker's do) into the project's cache,
``MockApiServer.java`` is compiled against them with ``javac``; ``make k8s-mock`` (and so
``make test``) does both ahead: ``python -m tests.topology.k8s_api``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from pathlib import Path

from astraflow.topics.runtime import cache_root, find_java

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "tools" / "k8s_mock"
POM, MAIN = SRC / "pom.xml", SRC / "MockApiServer.java"


class MockApiUnavailable(RuntimeError):
    """The mock could not be fetched, built or started; the message says which step and why."""


def version() -> str:
    m = re.search(r"<fabric8.version>([^<]+)</fabric8.version>", POM.read_text())
    if not m:
        raise MockApiUnavailable(f"{POM}: no <fabric8.version> property")
    return m.group(1)


def build(fetch: bool = True) -> Path:
    """The folder holding ``libs/`` (the jars) and ``classes/`` (the compiled main), built once."""
    home = cache_root() / "k8s-mock" / version()
    libs, classes = home / "libs", home / "classes"
    if not (libs / ".complete").exists():
        if not fetch:
            raise MockApiUnavailable(f"fabric8's mock API server is not fetched into {libs}: run `make k8s-mock`")
        mvn = shutil.which("mvn")
        if not mvn:
            raise MockApiUnavailable("Maven (`mvn`) is needed once to fetch fabric8's mock API server: `make k8s-mock`")
        tmp = libs.with_name("libs.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        out = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
                              f"-DoutputDirectory={tmp}", "-DincludeScope=runtime"],
                             capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-20:])
            raise MockApiUnavailable(f"mvn could not fetch {POM}'s dependencies:\n{tail}")
        shutil.rmtree(libs, ignore_errors=True)
        tmp.rename(libs)
        (libs / ".complete").write_text(version())
    built = classes / "MockApiServer.class"
    if not built.exists() or built.stat().st_mtime < MAIN.stat().st_mtime:
        javac = shutil.which("javac")
        if not javac:
            raise MockApiUnavailable("javac (a JDK 17+) is needed to compile tools/k8s_mock/MockApiServer.java")
        classes.mkdir(parents=True, exist_ok=True)
        out = subprocess.run([javac, "-cp", str(libs / "*"), "-d", str(classes), str(MAIN)],
                             capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise MockApiUnavailable(f"javac {MAIN}:\n{out.stderr.strip()}")
    return home


class MockApiServer:
    """The mock's JVM: :attr:`url` once it serves; :meth:`close` ends it (its stdin closes)."""

    def __init__(self, start_timeout_s: float = 120.0) -> None:
        home = build()
        self.proc = subprocess.Popen(
            [find_java(), "-Xmx256m", "-cp", f"{home / 'classes'}:{home / 'libs' / '*'}", "MockApiServer",
             "127.0.0.1", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.url = self._wait_listening(start_timeout_s)

    def _wait_listening(self, timeout_s: float) -> str:
        found: dict[str, str] = {}
        seen: list[str] = []

        def read() -> None:
            for line in self.proc.stdout:
                if line.startswith("listening "):
                    found["url"] = line.split()[1]
                    break
                seen.append(line.rstrip())
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if "url" not in found:
            self.close()
            raise MockApiUnavailable(f"the mock API server did not start within {timeout_s:.0f}s: "
                                     + "\n".join(seen[-20:]))
        # after the line, the JVM logs nothing we read: drain it so it never blocks on a full pipe
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()
        return found["url"].replace("localhost", "127.0.0.1")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    print(f"fabric8's mock API server {version()} is built in {build()}")
