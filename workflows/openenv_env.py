"""Environments written for OpenEnv, reached on their server: the ``openenv`` adapter.

An OpenEnv server (``openenv-core``'s ``create_app``; what TRL, SkyRL, verifiers and others
speak) keeps an episode's state in a **WebSocket session** at ``<url>/ws``: one connection is
one session with an environment instance of its own, closed with the connection. Messages are
JSON objects ``{"type", "data"}``:

=====================================================  ======================================================
sent                                                   answered
=====================================================  ======================================================
``{"type": "reset", "data": {seed, episode_id, ...}}``  ``{"type": "observation", "data": {"observation": {...},
                                                       "reward": number|null, "done": bool}}``
``{"type": "step", "data": {<the action's fields>}}``    the same
``{"type": "state"}``                                  ``{"type": "state", "data": {"episode_id", "step_count", ...}}``
``{"type": "close"}``                                  (the server ends the session)
=====================================================  ======================================================

and any of them may be answered ``{"type": "error", "data": {"message", "code", ...}}``
(``VALIDATION_ERROR`` with pydantic's ``errors`` naming the fields, ``EXECUTION_ERROR`` when the
environment raised, ``CAPACITY_REACHED`` when the server holds ``max_concurrent_envs``
sessions already). The server's HTTP ``POST /reset`` and ``/step`` make a fresh environment per
call, so they cannot carry a multi-step episode; this adapter speaks the WebSocket only.

:class:`OpenEnvEnvironment` (registered as ``openenv``) maps it onto the environment protocol
(:mod:`.environments`), one session per instance (so per sample of an episode):

* ``reset(task)`` opens the session and sends ``reset`` with ``seed`` (the sample's),
  ``episode_id`` (``<task id>/<sample>``), ``task`` (``{prompt, answer, metadata, attempt}``: an
  environment whose ``reset`` takes a ``task`` argument plays the job's data; one that does not
  never sees it, the server passes only the keywords ``reset`` declares) and
  ``env_params.reset_params``; the observation becomes the agent's text (below).
* ``step(action)`` sends the action as the action model's fields: text as
  ``{env_params.action_field: text}``, a JSON tool call as its ``arguments`` (``tool_calls:
  fields``) or as OpenEnv's MCP ``{"type": "call_tool", "tool_name", "arguments"}``
  (``tool_calls: mcp``). The answer is ``(text, reward, done, {})``, a ``null`` reward is 0.
* the observation's text is its ``env_params.observation_field`` when set, else the whole
  observation (its fields but ``reward``, ``done`` and ``metadata``, which the server does not
  send) as JSON with sorted keys.
* :meth:`OpenEnvEnvironment.state` asks for the session's ``state``; ``close()`` sends ``close``
  and closes the connection.

Failures, and which are tried again (what :mod:`.http_pool` does for the ``http`` protocol):
opening the session and its ``reset`` are retried with backoff when the connection could not
be made or broke before the answer (a reset on a new connection is a new session: repeating it
is harmless), and while the server is at capacity (until ``timeout_s``); a ``step`` is never
sent twice. An unreachable server fails the episode naming the URL (retriable); an action or
message the server refuses names the fields (not retriable; a refused *tool call* is answered
to the model as an observation instead, since the model chose its fields); an answer outside
the protocol fails it as ``env_garbage`` naming what is wrong. Requests outstanding per server
are bounded (``max_in_flight``) and counted like the ``http`` client's (``summary.json``'s
``env_servers``).

It knows nothing of tokenizers, engines or Kafka, and nothing of OpenEnv's own code: it speaks
the wire protocol with ``websockets``, which the ``openenv`` extra installs.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from .environments import ENV_GARBAGE, EnvironmentFailed, EnvTask, environment
from .http_pool import ATTEMPTS, ServerGate, backoff, pool_for

__all__ = ["OpenEnvEnvironment", "OpenEnvRefused", "OpenEnvActionRefused", "OpenEnvServerError", "ws_url",
           "INSTALL"]

NAME = "openenv"
#: ``env_params.max_in_flight``'s default: a node's requests outstanding at one server
MAX_IN_FLIGHT = 8
_MAX_MESSAGE = 16 << 20
_TOOL_CALLS = ("fields", "mcp")
_RESERVED = ("seed", "episode_id", "task")
INSTALL = "pip install -e '.[openenv]' in a checkout (`make install` does), or pip install 'astraflow[openenv]'"


class OpenEnvRefused(ValueError):
    """The server refused what was sent (a message outside its schema, a handshake that is not
    OpenEnv's): the same task is refused the same way again."""


class OpenEnvActionRefused(OpenEnvRefused):
    """The server's action model refused an action; ``fields`` says which field and why."""

    def __init__(self, message: str, fields: list[str]) -> None:
        super().__init__(message)
        self.fields = fields


class OpenEnvServerError(RuntimeError):
    """The server's side failed (its environment raised, could not be made, or the server is
    full): another try may pass."""


class _AtCapacity(OpenEnvServerError):
    pass


def ws_url(url: str) -> str:
    """The session endpoint of the server at ``url``: ``<url>/ws``, http(s) as ws(s)."""
    parts = urllib.parse.urlsplit(url.rstrip("/"))
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urllib.parse.urlunsplit((scheme, parts.netloc, parts.path + "/ws", "", ""))


def _websockets():
    """``(connect, ConnectionClosed, InvalidHandshake, InvalidStatus)`` of the ``websockets``
    library. Imported here, not at the top: every shipped environment is imported at the first
    workflow lookup (:mod:`.builtin`), and this one's library is an optional extra."""
    try:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
        from websockets.sync.client import connect
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"env: openenv needs the websockets package (the openenv extra): {INSTALL}") from e
    return connect, ConnectionClosed, InvalidHandshake, InvalidStatus


def _garbage(detail: str) -> EnvironmentFailed:
    return EnvironmentFailed(NAME, ENV_GARBAGE, detail, False)


@environment(NAME)
class OpenEnvEnvironment:
    """An OpenEnv environment served at ``url``, one WebSocket session per instance (see the
    module's docstring for the mapping and the retry rules).

    ``env_params``: ``url`` (the server's http(s):// or ws(s):// address), ``action_field``
    (the action model's text field, default ``message``), ``observation_field`` (the
    observation's text field; unset: the observation as JSON), ``tool_calls`` (``fields`` or
    ``mcp``), ``reset_params`` (more keywords for the environment's ``reset``),
    ``reward_range`` (what an episode's summed reward may be, default ``[0, 1]``: the dataflow
    refuses a group outside it), ``timeout_s`` (one call), ``max_in_flight`` (requests a node
    has outstanding at this server).
    """

    def __init__(self, url: str = "", action_field: str = "message", observation_field: str = "",
                 tool_calls: str = "fields", reset_params: Mapping[str, Any] | None = None,
                 reward_range: Any = (0.0, 1.0), timeout_s: float = 30.0, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.check_params(url, action_field, observation_field, tool_calls, reset_params, reward_range, timeout_s,
                          max_in_flight)
        self.url, self.ws_url = url.rstrip("/"), ws_url(url)
        self.action_field, self.observation_field, self.tool_calls = action_field, observation_field, tool_calls
        self.reset_params = dict(reset_params or {})
        self.timeout_s = float(timeout_s)
        self.gate = pool_for(url, max_in_flight, ServerGate)
        self._ws = None

    @staticmethod
    def check_params(url: str = "", action_field: str = "message", observation_field: str = "",
                     tool_calls: str = "fields", reset_params: Mapping[str, Any] | None = None,
                     reward_range: Any = (0.0, 1.0), timeout_s: float = 30.0,
                     max_in_flight: int = MAX_IN_FLIGHT) -> None:
        """``env_params`` checked when the job config loads."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ValueError(f"env_params.url is {url!r}; it is the OpenEnv server's http(s):// (or ws(s)://) "
                             f"address")
        if not isinstance(action_field, str) or not action_field:
            raise ValueError(f"env_params.action_field is {action_field!r}; it names the action model's text field "
                             f"(the server's GET /schema lists them)")
        if not isinstance(observation_field, str):
            raise ValueError(f"env_params.observation_field is {observation_field!r}; it names the observation's "
                             f"text field, or is empty for the whole observation as JSON")
        if tool_calls not in _TOOL_CALLS:
            raise ValueError(f"env_params.tool_calls is {tool_calls!r}; it is one of {', '.join(_TOOL_CALLS)}")
        if reset_params is not None:
            if not isinstance(reset_params, Mapping):
                raise ValueError(f"env_params.reset_params is {type(reset_params).__name__}; it is a mapping of "
                                 f"keywords for the environment's reset")
            taken = sorted(set(reset_params) & set(_RESERVED))
            if taken:
                raise ValueError(f"env_params.reset_params names {taken[0]!r}, which the adapter sends itself "
                                 f"(it sends {', '.join(_RESERVED)})")
            try:
                json.dumps(dict(reset_params))
            except (TypeError, ValueError) as e:
                raise ValueError(f"env_params.reset_params is not JSON: {e}") from None
        _check_range(reward_range)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < 3600:
            raise ValueError(f"env_params.timeout_s is {timeout_s!r}; it is a number of seconds in (0, 3600)")
        if type(max_in_flight) is not int or not 1 <= max_in_flight <= 1024:
            raise ValueError(f"env_params.max_in_flight is {max_in_flight!r}; it is how many requests a node may "
                             f"have outstanding at this server, an integer in [1, 1024]")
        try:
            _websockets()
        except ModuleNotFoundError as e:
            raise ValueError(str(e)) from None

    @staticmethod
    def reward_range(params: Mapping[str, Any]) -> tuple[float, float]:
        """What an episode's summed reward may be: ``env_params.reward_range`` (default 0 to 1)."""
        lo, hi = params.get("reward_range", (0.0, 1.0))
        return float(lo), float(hi)

    # -- the environment protocol ---------------------------------------------------------

    def reset(self, task: EnvTask) -> str:
        self.close()  # a second reset is a new session
        data = {**self.reset_params, "seed": task.seed, "episode_id": f"{task.episode_id}/{task.sample}",
                "task": {"prompt": task.prompt, "answer": task.answer, "metadata": dict(task.metadata),
                         "attempt": task.attempt}}
        obs, _reward, done = self._open(data)
        if done:
            self.close()
            raise _garbage("reset answered done: true: the episode is over before its first action")
        return obs

    def step(self, action: Any) -> tuple[str, float, bool, dict]:
        if self._ws is None:
            raise OpenEnvRefused("step before reset (or after the session ended)")
        payload = self._action(action)
        closed = _websockets()[1]
        try:
            with self.gate.slot(self.timeout_s):
                self.gate.count(requests=1)
                try:
                    data = self._exchange({"type": "step", "data": payload}, "step", self.timeout_s)
                except closed as e:  # the session went with its connection; the step is not sent again
                    self._ws = None
                    raise ConnectionError(f"OpenEnv server {self.url}: the session's connection broke during step "
                                          f"({e})") from None
            obs, reward, done = self._result(data, "step")
        except OpenEnvActionRefused as e:
            if isinstance(action, Mapping):  # the model chose these fields: it is told, as the world would
                return "error: " + "; ".join(e.fields), 0.0, False, {}
            self.gate.count(failures=1)
            raise
        except Exception:
            self.gate.count(failures=1)
            raise
        if done:
            self.close()
        return obs, reward, done, {}

    def state(self) -> dict:
        """The session's OpenEnv ``state`` (``episode_id``, ``step_count`` and what the
        environment adds). Not part of the environment protocol: the agent workflow never asks."""
        if self._ws is None:
            raise OpenEnvRefused("state before reset (or after the session ended)")
        with self.gate.slot(self.timeout_s):
            self.gate.count(requests=1)
            return self._exchange({"type": "state"}, "state", self.timeout_s)

    def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is None:
            return
        try:
            ws.send(json.dumps({"type": "close"}))
            # the server ends the session (closing its environment), then the connection: waiting
            # for that closes cleanly on both sides, and the environment is closed on return
            ws.recv(timeout=min(2.0, self.timeout_s))
        except Exception:  # noqa: BLE001 - the connection closed (as it should), or was gone already
            pass
        ws.close()

    # -- the wire ---------------------------------------------------------------------------

    def _open(self, data: dict) -> tuple[str, float, bool]:
        """Connect and reset, retried while nothing the server did can outlive the try."""
        connect, closed, handshake, bad_status = _websockets()
        start = time.monotonic()
        deadline = start + self.timeout_s
        k = 0
        while True:
            left = max(0.01, deadline - time.monotonic())
            full = False
            with self.gate.slot(left):
                self.gate.count(requests=1)
                try:
                    ws = connect(self.ws_url, open_timeout=left, close_timeout=min(2.0, self.timeout_s),
                                 max_size=_MAX_MESSAGE, legacy=True)  # a connection for the session's life
                except bad_status as e:
                    self.gate.count(failures=1)
                    raise OpenEnvRefused(f"{self.ws_url}: the WebSocket handshake was answered HTTP "
                                         f"{e.response.status_code}: no OpenEnv server there (env_params.url is the "
                                         f"address create_app serves)") from None
                except (OSError, handshake) as e:
                    why = f"unreachable ({type(e).__name__}: {e})"  # nothing was sent
                else:
                    self._ws = ws
                    try:
                        return self._result(self._exchange({"type": "reset", "data": data}, "reset", left), "reset")
                    except (closed, OSError) as e:  # the session died with its connection: a new one is fresh
                        why = f"the connection broke before reset's answer ({type(e).__name__}: {e})"
                    except _AtCapacity as e:
                        why, full = str(e), True
                    except BaseException:
                        self.gate.count(failures=1)
                        self.close()
                        raise
                    self.close()
            k += 1
            wait = backoff(k - 1)
            if (k >= ATTEMPTS and not full) or time.monotonic() + wait >= deadline:
                self.gate.count(failures=1)
                tried = f"{k} tries in {time.monotonic() - start:.1f} s"
                if full:
                    raise OpenEnvServerError(f"OpenEnv server {self.url} is {why} ({tried}): raise its "
                                             f"max_concurrent_envs (create_app) or run fewer samples at once")
                raise ConnectionError(f"OpenEnv server {self.url} ({self.ws_url}): {why} ({tried})")
            self.gate.count(retries=1)
            time.sleep(wait)

    def _exchange(self, message: dict, what: str, timeout_s: float) -> dict:
        """Send ``message`` on the session and read its answer's ``data``."""
        ws, closed = self._ws, _websockets()[1]
        try:
            ws.send(json.dumps(message))
            raw = ws.recv(timeout=timeout_s)
        except TimeoutError:
            self.close()  # a late answer would be read as the next call's
            raise TimeoutError(f"OpenEnv server {self.url}: {what} did not answer within {timeout_s:.3g} s") from None
        except closed as e:
            # a server that refuses the session (full) says why and closes at once: read that
            try:
                raw = ws.recv(timeout=0)
            except Exception:  # noqa: BLE001 - nothing was said: the connection's end stands
                raise e from None
        try:
            msg = json.loads(raw)
        except ValueError:
            raise _garbage(f"{what} was answered {str(raw)[:80]!r}, not JSON") from None
        kind = msg.get("type") if isinstance(msg, dict) else None
        data = msg.get("data") if isinstance(msg, dict) else None
        if kind == "error":
            raise self._error(what, data if isinstance(data, dict) else {})
        expected = "state" if what == "state" else "observation"
        if kind != expected or not isinstance(data, dict):
            raise _garbage(f"{what} was answered {str(msg)[:120]!r}, not a message of type {expected!r} with a "
                           f"data object")
        return data

    def _error(self, what: str, data: dict) -> Exception:
        code, message = data.get("code", "UNKNOWN"), str(data.get("message", ""))[:300]
        if code == "CAPACITY_REACHED":
            return _AtCapacity(f"at capacity ({data.get('active_sessions', '?')} of {data.get('max_sessions', '?')} "
                               f"sessions)")
        if code == "VALIDATION_ERROR":
            fields = [_field(e) for e in data.get("errors") or ()] or [message]
            if what == "step":
                return OpenEnvActionRefused(
                    f"OpenEnv server {self.url} refused the action: {'; '.join(fields)} (a text action is sent as "
                    f"{{{self.action_field!r}: text}}: env_params.action_field; the action model is at GET "
                    f"{self.url}/schema)", fields)
            return OpenEnvRefused(f"OpenEnv server {self.url} refused {what}: {'; '.join(fields)}")
        if code in ("INVALID_JSON", "UNKNOWN_TYPE"):
            return OpenEnvRefused(f"OpenEnv server {self.url} does not speak this protocol ({code}: {message})")
        # EXECUTION_ERROR (the environment raised), FACTORY_ERROR, SESSION_ERROR: the server's side
        return OpenEnvServerError(f"OpenEnv server {self.url}: {what} failed there ({code}: {message})")

    def _result(self, data: dict, what: str) -> tuple[str, float, bool]:
        """An observation message's ``(text, reward, done)``, or ``env_garbage`` naming the field."""
        obs, reward, done = data.get("observation"), data.get("reward"), data.get("done", False)
        if not isinstance(obs, dict):
            raise _garbage(f"{what}'s answer has observation {str(obs)[:60]!r}, not an object")
        if reward is None:
            reward = 0.0
        if not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise _garbage(f"{what}'s answer has reward {str(reward)[:40]!r}, not a finite number or null")
        if not isinstance(done, bool):
            raise _garbage(f"{what}'s answer has done {str(done)[:40]!r}, not true or false")
        return self._text(obs, what), float(reward), done

    def _text(self, obs: dict, what: str) -> str:
        f = self.observation_field
        if not f:
            return json.dumps(obs, sort_keys=True, ensure_ascii=False)
        if f not in obs:
            raise _garbage(f"{what}'s observation has no field {f!r} (env_params.observation_field); its fields: "
                           f"{', '.join(sorted(obs)) or 'none'}")
        if not isinstance(obs[f], str):
            raise _garbage(f"{what}'s observation field {f!r} is {type(obs[f]).__name__}, not text "
                           f"(env_params.observation_field)")
        return obs[f]

    def _action(self, action: Any) -> dict:
        if isinstance(action, Mapping):  # a JSON tool call {"name", "arguments"}
            args = dict(action.get("arguments") or {})
            if self.tool_calls == "mcp":
                return {"type": "call_tool", "tool_name": action.get("name"), "arguments": args}
            return args
        if not isinstance(action, str):
            raise OpenEnvRefused(f"an action is text or a tool call, not {type(action).__name__}")
        return {self.action_field: action}


def _field(error: Any) -> str:
    """One of pydantic's errors as ``field 'a.b': what``."""
    if not isinstance(error, dict):
        return str(error)[:120]
    loc = ".".join(str(p) for p in error.get("loc") or ()) or "?"
    return f"field {loc!r}: {str(error.get('msg', ''))[:120]}"


def _check_range(r: Any) -> None:
    ok = isinstance(r, (list, tuple)) and len(r) == 2 and all(
        not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) for x in r) and r[0] < r[1]
    if not ok:
        raise ValueError(f"env_params.reward_range is {r!r}; it is [low, high], two finite numbers with low < high: "
                         f"what an episode's summed reward may be (the dataflow refuses a group outside it)")
