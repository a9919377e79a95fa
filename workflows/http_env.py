"""Environments behind HTTP: the ``http`` adapter an agent episode uses, and a server for any
registered environment.

**The protocol** (JSON over HTTP POST; every body and answer is one JSON object):

``POST /start``  ``{"episode", "sample", "attempt", "seed", "task": {"prompt", "answer", "metadata"}}``
    -> ``{"session", "observation"}``. A session is keyed by episode, sample *and* attempt.
    A start for an (episode, sample) that already has a session of another attempt cancels
    that older session first (its reason: ``superseded``): a redelivered episode, whose first
    node died mid-episode and so never said goodbye, gets a fresh world, and the old one is
    not left running. A start repeated with the same attempt is refused (409).
``POST /interact``  ``{"session", "action"}`` -> ``{"observation", "reward", "done", "info"}``.
    ``action`` is the model's command text, or a ``{"name", "arguments"}`` object (a JSON tool
    call). After ``done`` the session is over and closed by the server.
``POST /cancel``  ``{"session"}`` -> ``{"cancelled": bool}``: the episode gives up on a session
    it has not finished (a limit, a deadline, a failure). Cancelling an unknown or finished
    session is not an error (``false``).
``GET /stats`` -> counts (``started``, ``finished``, ``cancelled`` by reason, ``open``) and the
    open sessions' keys, for operators and tests.

An answer with status 4xx says the request was wrong (the adapter fails the episode, not
retriable: the same task fails the same way); 5xx or a broken connection says the world is
(retriable). A call that failed before the server could have acted on it is sent again first
(:class:`HttpEnvironment` says which). A session idle for longer than the server's ``idle_s`` is cancelled
(``idle``), so a node that vanishes leaves nothing running for long even if no attempt
follows.

:class:`HttpEnvironment` (registered as ``http``) is the client: ``env_params: {url, timeout_s,
max_in_flight}``; its connections are kept alive and bounded per server (:mod:`.http_pool`).
:class:`EnvServer` serves one registered environment (an instance per session) with the
standard library's threaded HTTP server; ``astraflow env serve`` runs it as a process.
Neither knows about tokenizers, engines or Kafka.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .environments import EnvTask, environment, get_environment, retriable
from .http_pool import Retry, ServerPool, pool_for

__all__ = ["HttpEnvironment", "EnvServer", "EnvServerError", "EnvRequestError"]

SUPERSEDED, IDLE, CLIENT = "superseded", "idle", "client"
_MAX_BODY = 1 << 20
#: ``env_params.max_in_flight``'s default: a node's requests outstanding at one server
MAX_IN_FLIGHT = 8


class EnvRequestError(ValueError):
    """The server refused the request (4xx): the same task would be refused again."""


class EnvServerError(RuntimeError):
    """The server failed (5xx) or answered something that is not the protocol's JSON."""


def _call(pool: ServerPool, path: str, body: Mapping[str, Any], timeout_s: float, retry: Retry,
          repeat: Callable[[int], Mapping[str, Any]] | None = None) -> dict:
    """POST one protocol call through the server's pool; ``repeat(k)``: the body of retry ``k``."""
    def data(k: int) -> bytes:
        return json.dumps(body if k == 0 or repeat is None else repeat(k)).encode()
    status, raw = pool.request("POST", path, data, timeout_s, retry, _MAX_BODY)
    # a refused or broken connection raised above (OSError, HTTPException): the world's, retriable
    if status >= 400:
        detail = raw[:2000].decode("utf-8", "replace")
        err = EnvRequestError if 400 <= status < 500 else EnvServerError
        raise err(f"{path} answered {status}: {detail[:300]}")
    try:
        out = json.loads(raw)
    except ValueError:
        raise EnvServerError(f"{path} answered {raw[:80]!r}, not JSON") from None
    if not isinstance(out, dict):
        raise EnvServerError(f"{path} answered {type(out).__name__}, not a JSON object")
    return out


@environment("http")
class HttpEnvironment:
    """An environment served elsewhere, reached with the protocol above (one session per instance).

    Its calls go through the server's :class:`~.http_pool.ServerPool` (kept-alive connections
    shared by the process's sessions, at most ``max_in_flight`` requests outstanding). Which
    calls are retried when the connection fails, from the protocol's rules:

    * every call, when nothing was sent (the connection was refused or not made);
    * ``/start`` also when the connection broke after it was sent, before any answer: the lost
      start may have opened a session, so the retry is a start of a derived attempt
      (``<attempt>~retry<k>``), which supersedes that session if it exists (the server cancels
      it, reason ``superseded``), never a second world and never the 409 of a repeated attempt;
    * ``/cancel`` also then: cancelling twice answers ``false``, not an error;
    * ``/interact`` never once sent: the server may have stepped the world, and a repeated
      action would step it twice. It goes out only on a connection that has already carried an
      answer, so a full listen backlog (which resets new connections after their request) fails
      the safe call that proves the connection, not the step.
    """

    def __init__(self, url: str = "", timeout_s: float = 30.0, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.check_params(url, timeout_s, max_in_flight)
        self.url, self.timeout_s = url, float(timeout_s)
        self.pool = pool_for(url, max_in_flight)
        self.session: str | None = None
        self.done = False

    @staticmethod
    def check_params(url: str = "", timeout_s: float = 30.0, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        """``env_params`` checked when the job config loads."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"env_params.url is {url!r}; it is the environment server's http(s):// address")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < 3600:
            raise ValueError(f"env_params.timeout_s is {timeout_s!r}; it is a number of seconds in (0, 3600)")
        if type(max_in_flight) is not int or not 1 <= max_in_flight <= 1024:
            raise ValueError(f"env_params.max_in_flight is {max_in_flight!r}; it is how many requests a node may "
                             f"have outstanding at this server, an integer in [1, 1024]")

    def reset(self, task: EnvTask) -> str:
        body = {"episode": task.episode_id, "sample": task.sample, "attempt": task.attempt, "seed": task.seed,
                "task": {"prompt": task.prompt, "answer": task.answer, "metadata": dict(task.metadata)}}
        out = _call(self.pool, "/start", body, self.timeout_s, Retry.SENT,
                    repeat=lambda k: {**body, "attempt": f"{task.attempt}~retry{k}"})
        self.session = out.get("session")
        if not isinstance(self.session, str):
            raise EnvServerError(f"/start answered no session id: {str(out)[:80]}")
        return out.get("observation")  # type: ignore[return-value]  # the handle checks its shape

    def step(self, action: Any):
        if self.session is None:
            raise EnvRequestError("step before reset")
        out = _call(self.pool, "/interact", {"session": self.session, "action": action}, self.timeout_s,
                    Retry.UNSENT)
        missing = [k for k in ("observation", "reward", "done") if k not in out]
        if missing:
            return out  # not the protocol's four values: the handle fails the episode (env_garbage)
        self.done = out["done"] is True
        return out["observation"], out["reward"], out["done"], out.get("info") or {}

    def close(self) -> None:
        if self.session is not None and not self.done:
            try:
                _call(self.pool, "/cancel", {"session": self.session}, min(self.timeout_s, 5.0), Retry.SENT)
            except (OSError, http.client.HTTPException, EnvServerError, EnvRequestError):
                pass  # the server's idle bound ends it
        self.session = None


@dataclass
class _Session:
    id: str
    episode: str
    sample: int
    attempt: str
    env: Any
    lock: threading.Lock
    last: float


class EnvServer:
    """Serve the registered environment ``env`` (an instance per session) over the protocol.

    ``params``: the factory's keywords (as ``env_params`` of a job). ``address`` is
    ``http://host:port`` once started (port 0 picks a free one).
    """

    def __init__(self, env: str, params: Mapping[str, Any] | None = None, *, host: str = "127.0.0.1",
                 port: int = 0, idle_s: float = 300.0) -> None:
        self.name, self.factory, self.params = env, get_environment(env), dict(params or {})
        self.idle_s = float(idle_s)
        self._sessions: dict[str, _Session] = {}
        self._by_key: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.cancelled: Counter[str] = Counter()
        self.attempts: list[tuple[str, int, str]] = []  #: every start's (episode, sample, attempt), in order
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._httpd.daemon_threads = True
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "EnvServer":
        for target, name in ((self._httpd.serve_forever, "serve"), (self._reap, "reap")):
            t = threading.Thread(target=target, name=f"env-server-{self.name}-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def close(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
            self._by_key.clear()
        for s in sessions:
            self._close_env(s)

    def __enter__(self) -> "EnvServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the protocol ---------------------------------------------------------------------

    def stats(self) -> dict:
        with self._lock:
            return {"env": self.name, "started": self.counts["started"], "finished": self.counts["finished"],
                    "cancelled": dict(self.cancelled), "open": len(self._sessions),
                    "sessions": [{"session": s.id, "episode": s.episode, "sample": s.sample, "attempt": s.attempt}
                                 for s in self._sessions.values()]}

    def start_session(self, body: dict) -> dict:
        episode, sample, attempt = body.get("episode"), body.get("sample", 0), body.get("attempt", "")
        task = body.get("task")
        if not isinstance(episode, str) or not episode or type(sample) is not int or not isinstance(attempt, str) \
                or not isinstance(task, dict) or not isinstance(task.get("prompt"), str):
            raise EnvRequestError("/start needs episode (text), sample (an integer), attempt (text) and "
                                  "task.prompt (text)")
        key = (episode, sample)
        with self._lock:
            old_id = self._by_key.get(key)
            old = self._sessions.get(old_id) if old_id else None
            if old is not None and old.attempt == attempt:
                raise _Conflict(f"episode {episode!r} sample {sample} attempt {attempt!r} already has session "
                                f"{old.id}")
            if old is not None:
                self._drop(old, SUPERSEDED)
            self.attempts.append((episode, sample, attempt))
        env = self.factory(**self.params)
        meta = task.get("metadata") or {}
        seed = body.get("seed", 0)
        obs = env.reset(EnvTask(episode, task["prompt"], str(task.get("answer", "")), dict(meta), sample,
                                int(seed) if type(seed) is int else 0, attempt))
        sid = uuid.uuid4().hex
        with self._lock:
            self._sessions[sid] = _Session(sid, episode, sample, attempt, env, threading.Lock(), time.monotonic())
            self._by_key[key] = sid
            self.counts["started"] += 1
        return {"session": sid, "observation": obs}

    def interact(self, body: dict) -> dict:
        s = self._session(body)
        with s.lock:
            if self._sessions.get(s.id) is not s:
                raise EnvRequestError(f"session {s.id} was cancelled")
            obs, reward, done, info = s.env.step(body.get("action"))
            s.last = time.monotonic()
        if done is True:
            with self._lock:
                if self._sessions.get(s.id) is s:
                    self._forget(s)
                    self.counts["finished"] += 1
            self._close_env(s)
        return {"observation": obs, "reward": reward, "done": done, "info": dict(info or {})}

    def cancel(self, body: dict) -> dict:
        sid = body.get("session")
        with self._lock:
            s = self._sessions.get(sid) if isinstance(sid, str) else None
            if s is not None:
                self._drop(s, CLIENT)
        return {"cancelled": s is not None}

    def _session(self, body: dict) -> _Session:
        sid = body.get("session")
        with self._lock:
            s = self._sessions.get(sid) if isinstance(sid, str) else None
        if s is None:
            raise EnvRequestError(f"no open session {sid!r} (finished, cancelled or never started)")
        return s

    def _drop(self, s: _Session, reason: str) -> None:
        """Cancel ``s`` (the lock held); its environment is closed off the lock."""
        self._forget(s)
        self.cancelled[reason] += 1
        threading.Thread(target=self._close_env, args=(s,), daemon=True).start()

    def _forget(self, s: _Session) -> None:
        self._sessions.pop(s.id, None)
        if self._by_key.get((s.episode, s.sample)) == s.id:
            del self._by_key[(s.episode, s.sample)]

    @staticmethod
    def _close_env(s: _Session) -> None:
        close = getattr(s.env, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - a world that fails to close is gone anyway
                pass

    def _reap(self) -> None:
        while not self._stop.wait(min(1.0, self.idle_s / 4)):
            now = time.monotonic()
            with self._lock:
                for s in [s for s in self._sessions.values() if now - s.last > self.idle_s]:
                    self._drop(s, IDLE)

    def _handler(self):
        server = self
        routes = {"/start": server.start_session, "/interact": server.interact, "/cancel": server.cancel}

        class Handler(JsonHandler):

            def do_GET(self) -> None:  # noqa: N802 - the standard library's name
                if self.path == "/stats":
                    self._answer(HTTPStatus.OK, server.stats())
                else:
                    self._answer(HTTPStatus.NOT_FOUND, {"error": f"no GET {self.path}"})

            def do_POST(self) -> None:  # noqa: N802
                route = routes.get(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                if route is None or n > _MAX_BODY:
                    self.rfile.read(min(n, _MAX_BODY))
                    self._answer(HTTPStatus.NOT_FOUND if route is None else HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                 {"error": f"no POST {self.path}" if route is None else "body too large"})
                    return
                try:
                    body = json.loads(self.rfile.read(n) or b"{}")
                    if not isinstance(body, dict):
                        raise EnvRequestError("the body is not a JSON object")
                    self._answer(HTTPStatus.OK, route(body))
                except _Conflict as e:
                    self._answer(HTTPStatus.CONFLICT, {"error": str(e)})
                except (EnvRequestError, json.JSONDecodeError) as e:
                    self._answer(HTTPStatus.BAD_REQUEST, {"error": str(e)})
                except Exception as e:  # noqa: BLE001 - the environment's own failure
                    # on its input (the same task fails again): 422; the world's (may pass later): 500
                    status = HTTPStatus.INTERNAL_SERVER_ERROR if retriable(e) else HTTPStatus.UNPROCESSABLE_ENTITY
                    self._answer(status, {"error": f"{type(e).__name__}: {e}"})
        return Handler


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet HTTP/1.1 handler that answers JSON (the environment server's and the OpenAI
    endpoint's)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet: the servers count what happened
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Conflict(EnvRequestError):
    pass
