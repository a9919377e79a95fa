"""OpenEnv servers as processes of their own for the tests: started on a free port, ready once
``GET /health`` answers, stopped (SIGTERM, then SIGKILL) at the end."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from astraflow.topics.broker import free_port

GUESS = Path(__file__).with_name("openenv_guess.py")


def get(url: str, path: str) -> dict:
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def served(argv: list[str], cwd: Path | None = None, port: int | None = None) -> Iterator[str]:
    """Run ``argv`` (``{port}`` in it replaced by a free port); yield the server's http:// URL."""
    port = port or free_port()
    # its output to a file: a pipe nobody reads fills up and stops the server mid-run
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([a.replace("{port}", str(port)) for a in argv], cwd=cwd, stdout=log,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the OpenEnv server exited {proc.returncode}: {log.read()[-2000:]}")
            try:
                if get(url, "/health").get("status") == "healthy":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the OpenEnv server at {url} did not answer /health within 90 s")
            time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()


def guess_server(max_sessions: int = 64):
    """The ``guess`` environment (:mod:`openenv_guess`) under openenv-core's server."""
    return served([sys.executable, str(GUESS), "{port}", str(max_sessions)])
