"""A Toxiproxy server of ours, driven through its REST API with the standard library.

Toxiproxy (``github.com/Shopify/toxiproxy/v2`` v2.5.0, built by ``make toxiproxy`` into
``.tools/bin/``) is a TCP proxy with *toxics*: ``latency`` per direction, ``timeout`` (0: a
black hole), ``bandwidth`` (a cap per connection, which is why :mod:`.links` shapes with
``tc tbf`` instead), and ``enabled: false`` to close a proxy. It knows nothing about
namespaces or regions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from urllib.parse import quote
from pathlib import Path

from astraflow.topics.broker import free_port, stop_process

from .netns import LinkError, LinkUnavailable, die_with_parent

__all__ = ["TOOLS_BIN", "TOXIPROXY_ENV", "Toxiproxy", "toxiproxy_binary"]

#: Where ``make toxiproxy`` builds the server (git-ignored), relative to the repository.
TOOLS_BIN = Path(__file__).resolve().parents[1] / ".tools" / "bin"
TOXIPROXY_ENV = "ASTRAFLOW_TOXIPROXY"


def _q(name: str) -> str:
    return quote(name, safe="")  # proxy names come from region names: any text


def toxiproxy_binary() -> Path:
    """The Toxiproxy server: ``$ASTRAFLOW_TOXIPROXY``, else ``make toxiproxy``'s build, else on PATH."""
    env = os.environ.get(TOXIPROXY_ENV)
    if env:
        if not os.access(env, os.X_OK):
            raise LinkUnavailable(f"{TOXIPROXY_ENV}={env} is not an executable file")
        return Path(env)
    built = TOOLS_BIN / "toxiproxy-server"
    if os.access(built, os.X_OK):
        return built
    found = shutil.which("toxiproxy-server")
    if found:
        return Path(found)
    raise LinkUnavailable(f"no Toxiproxy server: run 'make toxiproxy' (builds v2.5.0 into {TOOLS_BIN}) "
                          f"or set {TOXIPROXY_ENV} to a toxiproxy-server binary")


class Toxiproxy:
    """A Toxiproxy server of ours on loopback, driven through its REST API.

    Proxies listen on home's loopback; :meth:`create` returns the port. ``enabled: false``
    (:meth:`set_enabled`) closes a proxy's listener and every connection through it: a cut.
    Byte counters come from its Prometheus ``/metrics`` (started with ``-proxy-metrics``).
    """

    def __init__(self, binary: str | os.PathLike | None = None, *, log_path: str | os.PathLike | None = None) -> None:
        self.binary = Path(binary) if binary else toxiproxy_binary()
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        for attempt in range(3):  # a free port can be taken before the server binds it: try another
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            argv = [str(self.binary), "-host", "127.0.0.1", "-port", str(self.port), "-proxy-metrics"]
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                         preexec_fn=die_with_parent)
            if self._wait_ready(attempt == 2):
                return

    def _wait_ready(self, last: bool) -> bool:
        deadline = time.monotonic() + 20
        while self.proc.poll() is None:
            try:
                self.version = self._request("GET", "/version")
            except (LinkError, OSError):
                if time.monotonic() > deadline:
                    self.close()
                    raise LinkError(f"Toxiproxy ({self.binary}) did not answer on {self.url}") from None
                time.sleep(0.05)
                continue
            if self.proc.poll() is None:  # the answer was ours, not another server's on that port
                return True
        if last:
            self.close()
            raise LinkError(f"Toxiproxy ({self.binary}) exited with {self.proc.returncode} at start")
        return False

    def _request(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            why = e.read().decode(errors="replace").strip()
            raise LinkError(f"Toxiproxy {method} {path}: HTTP {e.code}: {why}") from e
        except urllib.error.URLError as e:
            raise LinkError(f"Toxiproxy {method} {path}: {e.reason}") from e
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def create(self, name: str, upstream: str, listen: str = "127.0.0.1:0") -> int:
        """A proxy ``name`` from ``listen`` to ``upstream`` (``host:port``); the port it listens on."""
        proxy = self._request("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream,
                                                   "enabled": True})
        return int(proxy["listen"].rsplit(":", 1)[1])

    def add_toxic(self, proxy: str, name: str, kind: str, stream: str, **attributes: float) -> None:
        """A toxic (``latency``, ``bandwidth``, ``timeout``, ...) on one stream (``upstream``: from
        the client, ``downstream``: to it)."""
        self._request("POST", f"/proxies/{_q(proxy)}/toxics", {"name": name, "type": kind, "stream": stream,
                                                           "toxicity": 1.0, "attributes": attributes})

    def add_latency(self, proxy: str, latency_ms: float, jitter_ms: float = 0) -> None:
        """``latency_ms`` each way: a round trip through the proxy takes at least twice that."""
        for stream in ("upstream", "downstream"):
            self.add_toxic(proxy, f"latency_{stream}", "latency", stream, latency=int(latency_ms),
                           jitter=int(jitter_ms))

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._request("DELETE", f"/proxies/{_q(proxy)}/toxics/{_q(name)}")

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        self._request("POST", f"/proxies/{_q(proxy)}", {"enabled": enabled})

    def show(self, proxy: str) -> dict:
        return self._request("GET", f"/proxies/{_q(proxy)}")

    def delete(self, proxy: str) -> None:
        self._request("DELETE", f"/proxies/{_q(proxy)}")

    def stats(self) -> dict[str, dict[str, int]]:
        """Per proxy, bytes it received and sent per direction: ``{"received_upstream": ..., ...}``."""
        text = self._request("GET", "/metrics")
        out: dict[str, dict[str, int]] = {}
        pattern = re.compile(r'^toxiproxy_proxy_(received|sent)_bytes_total\{([^}]*)\}\s+(\S+)$', re.M)
        for what, labels, value in pattern.findall(text if isinstance(text, str) else ""):
            lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            out.setdefault(lab.get("proxy", "?"), {})[f"{what}_{lab.get('direction', '?')}"] = int(float(value))
        return out

    def close(self) -> None:
        stop_process(self.proc, 5)
        if self._log is not subprocess.DEVNULL:
            self._log.close()

    def __enter__(self) -> "Toxiproxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

