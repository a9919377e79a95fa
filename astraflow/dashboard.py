"""``astraflow dashboard``: a page that follows a job live, read from its topics alone.

:class:`DashboardState` folds a job's ``metrics``, ``control``, ``versions`` and ``dlq``
records into what the page shows: per policy the batch reward, held-out accuracy (and the
team's, each policy's role reward), version, staleness and trainer wait; the RaaS pool
(each node's version, tokens/s since it started, status, and ``gone`` once its heartbeat is
older than ``alive_s``; the pool's tokens/s in 5 s windows, from ``raas.tokens``); weight payload bytes, publish time and the time until each node held a
version; the dead letters (their count and the newest); and, given a topology, each
region's nodes and how many versions they are behind. It knows nothing of Kafka or HTTP:
records go in through :meth:`DashboardState.feed`, the page's data comes out of
:meth:`DashboardState.snapshot` and :meth:`DashboardState.since`.

:class:`Dashboard` is the server: one thread reads the four topics from their beginning (so
a dashboard opened late shows the whole run), another serves HTTP — the page
(``astraflow/web/``), the chart library the project installs from npm (Chart.js, under
``astraflow/web/node_modules``; no CDN), ``/api/state`` (the whole state as JSON) and
``/events``, server-sent events: a ``snapshot`` when a page connects, then an ``update`` every
``push_s`` with the points each series gained and the tables as they are now.

``astraflow run --dashboard`` serves one beside a job's launcher; ``astraflow dashboard --job
J`` follows any job on any cluster (``--run-dir`` for a finished run's own Kafka log).
"""

from __future__ import annotations

import json
import logging
import math
import mimetypes
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from astraflow.errors import FatalError
from astraflow.status import job_state

__all__ = ["Dashboard", "DashboardError", "DashboardState", "WEB_DIR", "alive_window", "chart_library",
           "plan_regions", "topology_regions"]

log = logging.getLogger(__name__)

#: The page's own files; ``node_modules`` beside them holds the chart library (``make install``).
WEB_DIR = Path(__file__).resolve().parent / "web"
#: Seconds of one point of the pool's tokens/s line.
TOKENS_WINDOW_S = 5.0
#: Chart.js's self-contained build, as npm installs it.
CHART_JS = Path("node_modules") / "chart.js" / "dist" / "chart.umd.js"


class DashboardError(FatalError):
    """The dashboard cannot serve: no such job, its chart library is not installed, a port in use."""


def chart_library(web_dir: Path = WEB_DIR) -> Path:
    """The chart library's file, or :class:`DashboardError` saying how to install it."""
    path = web_dir / CHART_JS
    if not path.is_file():
        raise DashboardError(f"the dashboard's chart library is missing ({path}); install it with `make install` "
                             f"(or `npm ci --prefix {web_dir}`)")
    return path


@dataclass
class Series:
    """One line of a chart: ``(x, y)`` points in arrival order, the newest ``keep`` of them;
    ``total`` counts every point ever added (a page's cursor into it)."""

    points: deque = field(default_factory=lambda: deque(maxlen=5000))
    total: int = 0

    def add(self, x: float, y: float) -> None:
        if not (math.isfinite(x) and math.isfinite(y)):
            return  # a NaN would break the page's JSON; the metric itself stays in the topic
        self.points.append((round(x, 4), round(y, 6)))
        self.total += 1

    def after(self, seen: int) -> list:
        """The points added after the first ``seen`` (all that are kept, if more were dropped)."""
        new = self.total - seen
        if new <= 0:
            return []
        pts = list(self.points)
        return pts[-new:] if new < len(pts) else pts


def _policy_of(component: str) -> str:
    return component.split(".", 1)[1] if "." in component else component


class DashboardState:
    """What the page shows, folded from a job's records (thread-safe: the reader feeds, pages read).

    ``regions`` maps a node id to its region (a topology's plan); ``clock`` is wall-clock time,
    the clock heartbeats and announcements are stamped with."""

    def __init__(self, job: str, policies: tuple[str, ...] = (), *, alive_s: float = 15.0,
                 regions: Callable[[str, str, str], str | None] | None = None,
                 clock: Callable[[], float] = time.time, keep_points: int = 5000, keep_dead_letters: int = 20) -> None:
        self.job, self.policies, self.alive_s = job, tuple(policies), alive_s
        self.regions, self.clock, self.keep = regions, clock, keep_points
        self._lock = threading.Lock()
        self.series: dict[str, Series] = {}
        self.beats: dict[str, Any] = {}  #: node id -> its newest Heartbeat
        self.versions: dict[str, Any] = {}  #: policy -> its newest VersionAnnouncement
        self.announced: dict[str, dict[int, float]] = {}  #: policy -> version -> announced at (ts)
        self._held: dict[str, int] = {}  #: node id -> the newest version its heartbeats reported
        self.dead_letters: deque = deque(maxlen=keep_dead_letters)
        self.dead_letter_count = 0
        self.done: dict[str, int] = {}  #: policy -> the version its trainer finished at
        self.failed: list[dict] = []
        self.records = 0
        self.t0: float | None = None  #: the first record's time: x of the time series
        self._encode_s: dict[tuple[str, int], float] = {}
        self._token_window: dict[str, tuple[int, float]] = {}  #: policy -> (open window, tokens in it)

    # -- folding records ------------------------------------------------------------------
    def _series(self, name: str) -> Series:
        s = self.series.get(name)
        if s is None:
            s = self.series[name] = Series(points=deque(maxlen=self.keep))
        return s

    def _since_start(self, ts: float) -> float:
        if self.t0 is None:
            self.t0 = ts
        return ts - self.t0

    def feed(self, message: Any) -> None:
        """Fold one record of ``metrics``, ``control``, ``versions`` or ``dlq`` (others are passed over)."""
        from astraflow.topics import DeadLetter, Heartbeat, Metric, VersionAnnouncement
        with self._lock:
            self.records += 1
            if isinstance(message, Metric):
                self._metric(message)
            elif isinstance(message, Heartbeat):
                self._heartbeat(message)
            elif isinstance(message, VersionAnnouncement):
                self._announcement(message)
            elif isinstance(message, DeadLetter):
                self.dead_letter_count += 1
                self.dead_letters.append({
                    "topic": message.source_topic, "partition": message.partition, "offset": message.offset,
                    "error_type": message.error_type, "error": message.error[:300], "consumer": message.consumer,
                    "ts": message.ts, "bytes": message.value_size})

    def _metric(self, m: Any) -> None:
        name, comp = m.name, m.component
        if m.ts:
            self._since_start(m.ts)
        if comp.startswith("trainer."):
            p = _policy_of(comp)
            key = {"trainer.reward": "reward", "trainer.staleness_max": "staleness", "trainer.wait_s": "wait_s",
                   "trainer.train_s": "train_s", "trainer.behav_logp_gap": "logp_gap",
                   "trainer.behav_logp_gap_p99": "logp_gap_p99",
                   "trainer.correction_masked_frac": "masked_frac"}.get(name)
            if key:
                self._series(f"{key}/{p}").add(m.step, m.value)
            elif name == "trainer.done":
                self.done[p] = m.step
            elif name in ("weights.delta_bytes", "weights.snapshot_bytes"):
                self._series(f"weight_bytes/{p}").add(m.step, m.value)
            elif name in ("weights.delta_encode_s", "weights.snapshot_encode_s"):
                self._encode_s[(p, m.step)] = m.value
            elif name in ("weights.delta_write_s", "weights.snapshot_write_s"):
                self._series(f"publish_s/{p}").add(m.step, self._encode_s.pop((p, m.step), 0.0) + m.value)
        elif name == "raas.tokens" and m.ts:
            self._tokens(str(m.labels.get("policy") or "policy"), m.ts, m.value)
        elif comp.startswith("eval."):
            if name == "eval.accuracy":
                self._series(f"heldout/{_policy_of(comp)}").add(m.step, m.value)
            elif name == "eval.team_accuracy":
                self._series("heldout/team").add(m.step, m.value)
            elif name == "eval.policy_reward":
                self._series(f"role_reward/{m.labels.get('policy', _policy_of(comp))}").add(m.step, m.value)

    def _heartbeat(self, b: Any) -> None:
        self.beats[b.node_id] = b
        if b.ts:
            self._since_start(b.ts)
        if b.status == "failed" and not any(f["node"] == b.node_id for f in self.failed):
            self.failed.append({"node": b.node_id, "role": b.role, "policy": b.policy, "error": b.error})
        if b.role != "raas":
            return
        # the time from a version's announcement until this node held it (to a heartbeat's grain)
        if b.version > self._held.get(b.node_id, -1):
            self._held[b.node_id] = b.version
            at = self.announced.get(b.policy, {}).get(b.version)
            if at is not None and b.ts >= at:
                self._series(f"weight_latency/{b.policy}").add(b.version, b.ts - at)

    def _announcement(self, a: Any) -> None:
        self.versions[a.policy] = a
        self.announced.setdefault(a.policy, {})[a.version] = a.created_at
        if a.created_at:
            self._series(f"version/{a.policy}").add(self._since_start(a.created_at), a.version)

    def _tokens(self, policy: str, ts: float, tokens: float) -> None:
        """The pool's throughput: the tokens its nodes report generating (``raas.tokens``, one
        record per poll) summed in windows of ``TOKENS_WINDOW_S`` by the records' own time, a
        window's point added once a later record shows it closed (so a run read afterwards
        draws the same line as it did live)."""
        t = self._since_start(ts)
        bucket = int(t // TOKENS_WINDOW_S)
        open_bucket, total = self._token_window.get(policy, (bucket, 0.0))
        if bucket > open_bucket:
            self._series(f"tokens_per_s/{policy}").add((open_bucket + 1) * TOKENS_WINDOW_S, total / TOKENS_WINDOW_S)
            for empty in range(open_bucket + 1, bucket):  # windows without a record: nothing generated
                self._series(f"tokens_per_s/{policy}").add((empty + 1) * TOKENS_WINDOW_S, 0.0)
            open_bucket, total = bucket, 0.0
        # (a record stamped just before the open window, from another node's poll, counts in it)
        self._token_window[policy] = (open_bucket, total + tokens)

    # -- what the page reads --------------------------------------------------------------
    def _node_state(self, b: Any, now: float, job_done: bool) -> str:
        """A node's state: its heartbeat's while fresh; once it is older than the window, ``done``
        when the node stopped because its work ended (the job is done, or it is the trainer of
        a policy that reported ``trainer.done``), else ``gone`` (it died or was cut off)."""
        if b.status in ("alive", "starting"):
            if now - b.ts < self.alive_s:
                return b.status
            finished = job_done or (b.role == "trainer" and b.policy in self.done)
            return "done" if finished else "gone"
        return b.status  # failed, stopped, ...

    def tables(self) -> dict:
        """Everything but the series: the pool, versions, dead letters, regions, the job's state."""
        now = self.clock()
        with self._lock:
            newest = {p: a.version for p, a in self.versions.items()}
            policies = sorted(set(self.policies) | set(self.versions) | {b.policy for b in self.beats.values() if b.policy})
            job_done = job_state(policies, self.done, False, False, False) == "done"
            nodes = []
            for b in sorted(self.beats.values(), key=lambda b: (b.role, b.node_id)):
                region = self.regions(b.node_id, b.role, b.policy) if self.regions else None
                nodes.append({"node": b.node_id, "role": b.role, "policy": b.policy, "version": b.version,
                              "behind": max(0, newest.get(b.policy, b.version) - b.version),
                              "tokens_per_s": round(b.tokens_per_s, 1), "state": self._node_state(b, now, job_done),
                              "last_seen_s": round(max(0.0, now - b.ts), 1), "region": region})
            raas = [n for n in nodes if n["role"] == "raas"]
            regions: dict[str, dict] = {}
            if self.regions:
                for n in nodes:
                    r = regions.setdefault(n["region"] or "?", {"region": n["region"] or "?", "nodes": 0, "alive": 0,
                                                                 "max_behind": 0, "max_last_seen_s": 0.0})
                    r["nodes"] += 1
                    r["alive"] += n["state"] in ("alive", "starting")
                    if n["state"] in ("alive", "starting"):
                        r["max_behind"] = max(r["max_behind"], n["behind"])
                        r["max_last_seen_s"] = max(r["max_last_seen_s"], n["last_seen_s"])
            state = job_state(policies, self.done, bool(self.failed),
                              any(n["state"] in ("alive", "starting") for n in nodes), bool(self.records))
            return {
                "job": self.job, "state": state, "policies": policies, "records": self.records,
                "done": dict(self.done), "failed": list(self.failed), "alive_s": self.alive_s,
                "versions": {p: {"version": a.version, "kind": a.kind, "epoch": a.epoch,
                                 "age_s": round(max(0.0, now - a.created_at), 1)} for p, a in sorted(self.versions.items())},
                "pool": {"nodes": raas, "alive": sum(n["state"] in ("alive", "starting") for n in raas),
                         # the newest closed window of each policy's pool (what the chart's last point says)
                         "tokens_per_s": round(sum(s.points[-1][1] for k, s in self.series.items()
                                                   if k.startswith("tokens_per_s/") and s.points), 1)},
                "components": [n for n in nodes if n["role"] != "raas"],
                "dead_letters": {"count": self.dead_letter_count, "latest": list(self.dead_letters)[::-1]},
                "regions": sorted(regions.values(), key=lambda r: r["region"]),
            }

    def snapshot(self) -> tuple[dict, dict[str, int]]:
        """The whole state (every kept point) and the cursor a page holds after it."""
        with self._lock:
            series = {k: list(s.points) for k, s in self.series.items()}
            cursor = {k: s.total for k, s in self.series.items()}
        return {"series": series, **self.tables()}, cursor

    def since(self, cursor: dict[str, int]) -> tuple[dict, dict[str, int]]:
        """The points each series gained after ``cursor``, the tables as they are now, the new cursor."""
        with self._lock:
            series = {}
            new_cursor = dict(cursor)
            for k, s in self.series.items():
                pts = s.after(cursor.get(k, 0))
                if pts:
                    series[k] = pts
                new_cursor[k] = s.total
        return {"series": series, **self.tables()}, new_cursor


# -- the server -----------------------------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, fmt: str, *args: Any) -> None:  # the access log goes to debug, not stderr
        log.debug("dashboard: " + fmt, *args)

    def _send(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        path = self.path.split("?", 1)[0]
        dash = self.server.dashboard
        if path == "/api/state":
            state, _ = dash.state.snapshot()
            self._send(200, json.dumps(state).encode(), "application/json")
        elif path == "/events":
            self._events(dash)
        elif path == "/favicon.ico":
            self._send(204, b"", "image/x-icon")
        elif path == "/vendor/chart.umd.js":
            self._send(200, dash.chart_js.read_bytes(), "text/javascript")
        elif path in ("/", "/index.html") or path.strip("/") in dash.files:
            name = "index.html" if path in ("/", "/index.html") else path.strip("/")
            kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
            self._send(200, (dash.web_dir / name).read_bytes(), kind + ("; charset=utf-8" if "text" in kind else ""))
        else:
            self._send(404, b"not found\n", "text/plain")

    def _events(self, dash: Dashboard) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "keep-alive")
        self.end_headers()
        try:
            state, cursor = dash.state.snapshot()
            self._event("snapshot", state)
            while not dash.stopping.wait(dash.push_s):
                update, cursor = dash.state.since(cursor)
                self._event("update", update)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the page went away

    def _event(self, kind: str, data: dict) -> None:
        self.wfile.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    dashboard: Dashboard


class Dashboard:
    """Serve job ``job``'s dashboard on ``host:port`` (0: a free port), fed from ``bootstrap``.

    ``start`` reads the job's policies, starts the reader and the server; ``url`` is then where
    the page is; ``stop`` (or leaving the ``with`` block) ends both."""

    def __init__(self, bootstrap: str, job: str, *, host: str = "127.0.0.1", port: int = 0,
                 policies: tuple[str, ...] | None = None, alive_s: float = 15.0, push_s: float = 1.0,
                 regions: Callable[[str, str, str], str | None] | None = None, web_dir: Path = WEB_DIR,
                 wait_for_job_s: float = 0.0) -> None:
        self.bootstrap, self.job, self.host, self.port = bootstrap, job, host, port
        self.push_s, self.web_dir, self.wait_for_job_s = push_s, web_dir, wait_for_job_s
        self.chart_js = chart_library(web_dir)
        self.files = {p.name for p in web_dir.iterdir() if p.is_file() and p.suffix in (".html", ".js", ".css")}
        self._policies = policies
        self.state = DashboardState(job, policies or (), alive_s=alive_s, regions=regions)
        self.stopping = threading.Event()
        self._server: _Server | None = None
        self._threads: list[threading.Thread] = []
        self.reader_error: BaseException | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise DashboardError("the dashboard is not started")
        return f"http://{self.host}:{self._server.server_address[1]}/"

    def start(self) -> Dashboard:
        from astraflow.tracking import TrackError, job_policies_at
        deadline = time.monotonic() + self.wait_for_job_s
        while self._policies is None:
            try:
                self._policies = job_policies_at(self.bootstrap, self.job)
            except TrackError as e:
                if time.monotonic() >= deadline:
                    raise DashboardError(str(e).replace("start track", "start the dashboard")) from None
                time.sleep(0.5)
        self.state.policies = self._policies
        try:
            self._server = _Server((self.host, self.port), _Handler)
        except OSError as e:
            raise DashboardError(f"dashboard: cannot listen on {self.host}:{self.port}: {e.strerror or e}") from None
        self._server.dashboard = self
        for name, target in (("dashboard-reader", self._read), ("dashboard-http", self._server.serve_forever)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _read(self) -> None:
        """Feed the state from the four topics, from their beginning, until stopped."""
        from astraflow.topics import (Consumer, DeadLetter, Heartbeat, JobTopics, Metric, TopicPartition,
                                      VersionAnnouncement)
        from astraflow.tracking import PassedOver
        topics = JobTopics(job=self.job)
        tps = [TopicPartition(t, 0) for t in (topics.metrics, topics.control, topics.versions, topics.dlq)]
        passed = PassedOver(log.warning, reader="dashboard")
        try:
            with Consumer(self.bootstrap, partitions=tps, client_id="astraflow-dashboard", dead_letters=passed,  # type: ignore[arg-type]
                          expect={topics.metrics: (Metric,), topics.versions: (VersionAnnouncement,),
                                  topics.dlq: (DeadLetter,)}) as consumer:
                for tp in tps:
                    consumer.seek_to_beginning(tp)
                while not self.stopping.is_set():
                    for d in consumer.poll(300):
                        if isinstance(d.message, (Metric, Heartbeat, VersionAnnouncement, DeadLetter)):
                            self.state.feed(d.message)
        except Exception as e:  # noqa: BLE001 - the page says so; the job is not ours to stop
            if not self.stopping.is_set():
                self.reader_error = e
                log.warning("dashboard: reading job %s stopped: %s", self.job, e)

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def alive_window(heartbeat_s: float) -> float:
    """How old a node's newest heartbeat may be before the page shows it gone: three missed beats and a second."""
    return 3 * heartbeat_s + 1.0


def plan_regions(plan) -> Callable[[str, str, str], str | None]:
    """Node id -> region, from a topology's resolved plan (its pools' regions)."""

    def region(node_id: str, role: str, policy: str) -> str | None:
        if role == "dataflow":
            pool = next((p for p in plan.pools.values() if p.component == "dataflow"), None)
        else:
            pool = plan.pool_of(node_id, role, policy or None)
        return pool.region if pool is not None else None

    return region


def topology_regions(path: str | Path) -> Callable[[str, str, str], str | None]:
    """Node id -> region, from a topology file."""
    from astraflow.topology.launch import load_plan
    return plan_regions(load_plan(path))
