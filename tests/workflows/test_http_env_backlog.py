"""An environment server written from docs/agentic.md with the standard library, with a listen
backlog of 2, serves many concurrent episodes through the ``http`` client without losing one
(issue 62: one connection per call lost a fifth of a job's episodes to ``ConnectionResetError``).

The server here is what a user writes: ``http.server.ThreadingHTTPServer``, the protocol's three
calls, nothing of astraflow's. Each episode runs as the agent workflow runs it: the registered
``http`` factory behind an :class:`EnvHandle`, one per sample, all at once.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from astraflow.workflows.environments import EnvHandle, EnvTask, get_environment
from astraflow.workflows.http_env import HttpEnvironment  # noqa: F401 - registers ``http``

EPISODES, STEPS = 96, 3


class CountingGame:
    """``count to 3``: the actions 1, 2, 3 in turn; done at 3 with reward 1. Every (episode,
    sample, attempt) started and every action stepped is recorded, so a step applied twice shows."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: dict[str, dict] = {}
        self.steps: dict[str, list[str]] = {}
        self.started: list[tuple[str, int, str]] = []
        self.cancelled = 0

    def start(self, body: dict) -> dict:
        sid = uuid.uuid4().hex
        with self.lock:
            self.sessions[sid] = {"episode": body["episode"], "n": 0}
            self.steps[sid] = []
            self.started.append((body["episode"], body["sample"], body["attempt"]))
        return {"session": sid, "observation": "count to 3"}

    def interact(self, body: dict) -> dict:
        with self.lock:
            s = self.sessions[body["session"]]
            self.steps[body["session"]].append(body["action"])
            s["n"] += 1
            done = s["n"] >= STEPS
        return {"observation": f"at {s['n']}", "reward": 1.0 if done else 0.0, "done": done, "info": {}}

    def cancel(self, body: dict) -> dict:
        with self.lock:
            gone = self.sessions.pop(body.get("session"), None)
            self.cancelled += gone is not None
        return {"cancelled": gone is not None}


def serve(game: CountingGame, backlog: int, http11: bool) -> ThreadingHTTPServer:
    routes = {"/start": game.start, "/interact": game.interact, "/cancel": game.cancel}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if http11 else "HTTP/1.0"

        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(0.005)  # the world thinks a little: connections pile up at the backlog
            data = json.dumps(routes[self.path](body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    class Server(ThreadingHTTPServer):
        request_queue_size = backlog
        daemon_threads = True

    httpd = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def _episode(url: str, i: int, params: dict) -> str | None:
    """One episode's sample as the agent workflow runs it; None when it ended done, else its error."""
    handle = EnvHandle("http", get_environment("http"), {"url": url, **params}, timeout_s=30)
    try:
        handle.reset(EnvTask(f"t{i:07d}-p", "count", "3", {}, 0, i, f"node-0/{i}"))
        for k in range(1, STEPS + 1):
            _, reward, done, _ = handle.step(str(k))
        return None if done and reward == 1.0 else f"ended at {k} (done {done})"
    except Exception as e:  # noqa: BLE001 - what the episode would have failed with
        return f"{type(e).__name__}: {e}"
    finally:
        handle.close()


@pytest.mark.parametrize("http11,params", [(True, {}), (False, {"max_in_flight": 2})], ids=["keep_alive", "http10"])
def test_many_concurrent_episodes_on_a_small_backlog_lose_none(http11, params):
    """96 episodes at once, 0 failed, every action stepped exactly once: on a keep-alive server
    (what the docs ask for) with the client's defaults, and on a plain HTTP/1.0 one (the standard
    library's default: a new connection per call) with ``max_in_flight`` within its backlog
    (the docs' rule for such a server)."""
    game = CountingGame()
    httpd = serve(game, backlog=2, http11=http11)
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with ThreadPoolExecutor(EPISODES) as pool:
            errors = [e for e in pool.map(lambda i: _episode(url, i, params), range(EPISODES)) if e]
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert errors == [], f"{len(errors)} of {EPISODES} episodes failed, e.g. {errors[:3]}"
    # nothing stepped twice: each episode's live session got 1, 2, 3 once
    live = [s for s, steps in game.steps.items() if steps]
    assert len(live) == EPISODES and all(game.steps[s] == ["1", "2", "3"] for s in live)
    from astraflow.workflows.http_pool import server_counts
    counts = server_counts()[url]
    assert counts["failures"] == 0 and counts["requests"] >= EPISODES * (1 + STEPS)


def test_a_server_that_is_not_there_is_retried_then_fails_retriably():
    """A refused connection is retried with backoff, then fails the episode retriably
    (``env_error``), counted as a failure of that server."""
    from astraflow.workflows.environments import ENV_ERROR, EnvironmentFailed
    from astraflow.workflows.http_pool import ATTEMPTS, server_counts
    httpd = serve(CountingGame(), backlog=2, http11=True)
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.server_close()  # the port is free again: connections are refused
    handle = EnvHandle("http", get_environment("http"), {"url": url, "timeout_s": 5}, timeout_s=30)
    with pytest.raises(EnvironmentFailed) as e:
        handle.reset(EnvTask("t0000001-p", "count", "3", {}, 0, 1, "node-0/a"))
    handle.close()
    assert e.value.reason == ENV_ERROR and e.value.retriable and "ConnectionRefusedError" in str(e.value)
    assert server_counts()[url] == {"requests": ATTEMPTS, "retries": ATTEMPTS - 1, "failures": 1}


def test_max_in_flight_is_checked_when_the_config_loads():
    check = get_environment("http").check_params
    for bad in (0, 1.5, "8", True, 5000):
        with pytest.raises(ValueError, match=r"env_params.max_in_flight is .*an integer in \[1, 1024\]"):
            check("http://127.0.0.1:1", 30, bad)
    check("http://127.0.0.1:1", 30, 1)


def test_the_summary_adds_up_each_processs_last_counts_per_server():
    """What a RaaS node reports (``raas.env_*``, cumulative per process) becomes summary.json's
    ``env_servers``: the last totals of each process, added up per server."""
    from astraflow.run_outputs import _env_server_summary
    rows = []
    for node, pid, requests, failures in (("raas-0", 11, 40, 0), ("raas-0", 11, 90, 1), ("raas-1", 12, 30, 0)):
        for name, v in (("requests", requests), ("retries", 2), ("failures", failures)):
            rows.append({"name": f"raas.env_{name}", "value": v, "component": node, "label.server": "http://e:1",
                         "label.node": node, "label.pid": pid})
    rows.append({"name": "raas.busy_s", "value": 3.0, "component": "raas-0"})
    assert _env_server_summary(rows) == {"env_servers": {"http://e:1": {"requests": 120, "retries": 4,
                                                                       "failures": 1}}}
    assert _env_server_summary(rows[-1:]) == {}
