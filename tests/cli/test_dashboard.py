"""The dashboard's state: what the page shows, folded from a job's records (no broker needed here;
the browser test runs it against a real job)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from astraflow.dashboard import DashboardState, Series, alive_window, chart_library, topology_regions
from astraflow.topics import ChunkManifest, DeadLetter, Heartbeat, Metric, VersionAnnouncement

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _announce(policy: str, version: int, at: float) -> VersionAnnouncement:
    m = ChunkManifest(object_id=f"{policy}-{version}", topic=f"weights.{policy}", total_bytes=10, digest="d", chunks=[])
    return VersionAnnouncement(policy=policy, version=version, kind="delta", base_version=version - 1,
                               snapshot_version=0, manifest=m, checksum="c", created_at=at)


def _beat(node: str, version: int, ts: float, *, policy: str = "solver", role: str = "raas", status: str = "alive",
          tokens: float = 100.0, error: str = "") -> Heartbeat:
    return Heartbeat(node_id=node, role=role, policy=policy, version=version, tokens_per_s=tokens, ts=ts,
                     status=status, error=error)


def test_series_per_policy_and_the_points_a_page_has_not_seen():
    clock = Clock(1000.0)
    s = DashboardState("j", ("solver", "verifier"), clock=clock)
    for step in (1, 2, 3):
        s.feed(Metric("trainer.solver", "trainer.reward", 0.1 * step, step, 1000.0 + step))
        s.feed(Metric("trainer.verifier", "trainer.reward", 0.5, step, 1000.0 + step))
    s.feed(Metric("eval.solver", "eval.accuracy", 0.25, 3, 1004.0))
    s.feed(Metric("eval.solver", "eval.team_accuracy", 0.3, 3, 1004.0))
    s.feed(Metric("eval.solver", "eval.policy_reward", 0.7, 3, 1004.0, {"policy": "verifier"}))
    s.feed(Metric("trainer.solver", "trainer.reward", float("nan"), 4, 1005.0))  # not plottable: left out
    snap, cursor = s.snapshot()
    assert snap["series"]["reward/solver"] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert [p[1] for p in snap["series"]["reward/verifier"]] == [0.5, 0.5, 0.5]
    assert snap["series"]["heldout/solver"] == [(3, 0.25)]
    assert snap["series"]["heldout/team"] == [(3, 0.3)]
    assert snap["series"]["role_reward/verifier"] == [(3, 0.7)]
    update, cursor = s.since(cursor)
    assert update["series"] == {}  # nothing new
    s.feed(Metric("trainer.solver", "trainer.reward", 0.9, 5, 1006.0))
    update, cursor = s.since(cursor)
    assert update["series"] == {"reward/solver": [(5, 0.9)]}
    assert s.since(cursor)[0]["series"] == {}


def test_a_node_whose_heartbeat_stops_is_gone_after_the_window():
    clock = Clock(1000.0)
    s = DashboardState("j", ("solver",), alive_s=alive_window(2.0), clock=clock)
    assert s.alive_s == 7.0
    s.feed(_beat("raas-0", 3, 1000.0))
    s.feed(_beat("raas-1", 3, 1000.0, tokens=50.0))
    s.feed(_beat("trainer-solver", 3, 1000.0, role="trainer"))
    t = s.tables()
    assert [n["state"] for n in t["pool"]["nodes"]] == ["alive", "alive"]
    assert t["pool"]["alive"] == 2 and t["state"] == "running"
    assert [n["tokens_per_s"] for n in t["pool"]["nodes"]] == [100.0, 50.0]  # each node's own figure
    assert [c["node"] for c in t["components"]] == ["trainer-solver"]
    clock.t = 1006.0  # raas-1 beats on, raas-0 stopped at 1000
    s.feed(_beat("raas-1", 3, 1006.0, tokens=50.0))
    s.feed(_beat("trainer-solver", 3, 1006.0, role="trainer"))
    assert {n["node"]: n["state"] for n in s.tables()["pool"]["nodes"]} == {"raas-0": "alive", "raas-1": "alive"}
    clock.t = 1007.5  # 7.5 s after raas-0's last beat, past the 7 s window
    t = s.tables()
    assert {n["node"]: n["state"] for n in t["pool"]["nodes"]} == {"raas-0": "gone", "raas-1": "alive"}
    assert t["pool"]["alive"] == 1
    assert next(n for n in t["pool"]["nodes"] if n["node"] == "raas-0")["last_seen_s"] == 7.5


def test_a_node_that_stopped_because_its_work_ended_is_done_not_gone():
    """After a run: the trainer of a policy that reported ``trainer.done`` is ``done`` once its
    heartbeat is old, the other policy's nodes stay ``gone`` until the whole job is done, then
    every node that stopped beating is ``done``; a failed node stays failed."""
    clock = Clock(1000.0)
    s = DashboardState("j", ("solver", "verifier"), alive_s=alive_window(2.0), clock=clock)
    s.feed(_beat("raas-solver-0", 8, 1000.0))
    s.feed(_beat("raas-verifier-0", 8, 1000.0, policy="verifier"))
    s.feed(_beat("raas-verifier-1", 3, 1000.0, policy="verifier", status="failed", error="boom"))
    s.feed(_beat("trainer-solver", 8, 1000.0, role="trainer"))
    s.feed(_beat("trainer-verifier", 8, 1000.0, role="trainer", policy="verifier"))
    clock.t = 1010.0  # every heartbeat is past the 7 s window, nothing is done yet
    t = s.tables()
    assert {n["node"]: n["state"] for n in t["components"]} == {"trainer-solver": "gone", "trainer-verifier": "gone"}
    s.feed(Metric("trainer.solver", "trainer.done", 8, 8, 1009.0))
    t = s.tables()
    assert {n["node"]: n["state"] for n in t["components"]} == {"trainer-solver": "done", "trainer-verifier": "gone"}
    assert {n["node"]: n["state"] for n in t["pool"]["nodes"]}["raas-solver-0"] == "gone"  # the job goes on
    s.feed(Metric("trainer.verifier", "trainer.done", 8, 8, 1009.5))
    t = s.tables()
    assert t["state"] == "done"
    assert {n["node"]: n["state"] for n in t["pool"]["nodes"] + t["components"]} == {
        "raas-solver-0": "done", "raas-verifier-0": "done", "raas-verifier-1": "failed",
        "trainer-solver": "done", "trainer-verifier": "done"}


def test_the_pools_tokens_per_second_in_windows_of_the_records_own_time():
    """From ``raas.tokens`` (one record per poll, every node): a window's rate once it closed,
    an empty window as 0, per policy; the pool's figure is the newest window's."""
    s = DashboardState("j", ("a", "b"), clock=Clock(0.0))
    for node, ts, tokens in (("raas-a-0", 100.0, 40), ("raas-a-1", 101.0, 60), ("raas-a-0", 104.9, 100),
                             ("raas-b-0", 102.0, 10), ("raas-a-1", 106.0, 25), ("raas-a-0", 117.0, 5)):
        s.feed(Metric(node, "raas.tokens", tokens, 1, ts, {"node": node, "policy": node.split("-")[1]}))
    snap, _ = s.snapshot()
    # windows of 5 s from the first record (t=100): [0,5) holds 200 a-tokens, [5,10) 25, [10,15) none
    assert snap["series"]["tokens_per_s/a"] == [(5.0, 40.0), (10.0, 5.0), (15.0, 0.0)]
    assert "tokens_per_s/b" not in snap["series"]  # its window is still open
    assert snap["pool"]["tokens_per_s"] == 0.0  # a's newest closed window was empty
    s.feed(Metric("raas-b-0", "raas.tokens", 30, 1, 108.0, {"policy": "b"}))
    assert s.snapshot()[0]["series"]["tokens_per_s/b"] == [(5.0, 2.0)]


def test_versions_staleness_weight_latency_and_how_far_nodes_are_behind():
    clock = Clock(2000.0)
    s = DashboardState("j", ("solver",), clock=clock)
    s.feed(_announce("solver", 1, 2000.0))
    s.feed(_beat("raas-0", 1, 2001.5))
    s.feed(_announce("solver", 2, 2003.0))
    s.feed(_beat("raas-0", 1, 2003.5))  # not there yet: no point
    s.feed(_beat("raas-0", 2, 2005.0))
    s.feed(_beat("raas-1", 1, 2005.0))
    s.feed(Metric("trainer.solver", "weights.delta_bytes", 4096, 2, 2003.0))
    s.feed(Metric("trainer.solver", "weights.delta_encode_s", 0.25, 2, 2003.0))
    s.feed(Metric("trainer.solver", "weights.delta_write_s", 0.5, 2, 2003.0))
    s.feed(Metric("trainer.solver", "trainer.staleness_max", 1.0, 2, 2003.0))
    snap, _ = s.snapshot()
    # per node, the first heartbeat at each version it reported: raas-1 held version 1 at 2005
    assert snap["series"]["weight_latency/solver"] == [(1, 1.5), (2, 2.0), (1, 5.0)]
    assert snap["series"]["weight_bytes/solver"] == [(2, 4096.0)]
    assert snap["series"]["publish_s/solver"] == [(2, 0.75)]
    assert snap["series"]["staleness/solver"] == [(2, 1.0)]
    assert snap["series"]["version/solver"] == [(0.0, 1.0), (3.0, 2.0)]
    assert snap["versions"]["solver"]["version"] == 2
    assert {n["node"]: n["behind"] for n in snap["pool"]["nodes"]} == {"raas-0": 0, "raas-1": 1}


def test_dead_letters_failures_and_the_jobs_state():
    clock = Clock(3000.0)
    s = DashboardState("j", ("solver",), clock=clock)
    assert s.tables()["state"] == "not started"
    for i in range(25):
        s.feed(DeadLetter(source_topic="af.j.trajectories", partition=0, offset=i, error_type="DecodeError",
                          error="x" * 500, key=None, value="", consumer="dataflow", ts=3000.0, value_size=9))
    t = s.tables()
    assert t["dead_letters"]["count"] == 25
    assert [d["offset"] for d in t["dead_letters"]["latest"]][:3] == [24, 23, 22]  # newest first
    assert len(t["dead_letters"]["latest"]) == 20 and len(t["dead_letters"]["latest"][0]["error"]) == 300
    s.feed(_beat("raas-0", 0, 3000.0, status="failed", error="unknown reward 'nosuch'"))
    t = s.tables()
    assert t["state"] == "failed" and t["failed"][0]["error"] == "unknown reward 'nosuch'"
    assert t["pool"]["nodes"][0]["state"] == "failed"
    s.feed(Metric("trainer.solver", "trainer.done", 8, 8, 3001.0))
    assert s.tables()["state"] == "done" and s.tables()["done"] == {"solver": 8}


def test_a_series_keeps_its_newest_points_and_a_page_behind_gets_what_is_kept():
    s = Series()
    s.points = type(s.points)(maxlen=3)
    for i in range(5):
        s.add(i, i)
    assert list(s.points) == [(2, 2), (3, 3), (4, 4)] and s.total == 5
    assert s.after(4) == [(4, 4)]
    assert s.after(0) == [(2, 2), (3, 3), (4, 4)]  # more were added than are kept
    assert s.after(5) == []


def test_regions_from_a_topology_file_and_their_lag():
    regions = topology_regions(ROOT / "examples" / "topology_two_regions.yaml")
    assert regions("raas-us-0", "raas", "policy") == "us-east"
    assert regions("raas-eu-1", "raas", "policy") == "eu-west"
    assert regions("dataflow", "dataflow", "") == "us-east"
    clock = Clock(100.0)
    s = DashboardState("j", ("policy",), regions=regions, clock=clock)
    s.feed(_announce("policy", 5, 90.0))
    s.feed(_beat("raas-us-0", 5, 99.0, policy="policy"))
    s.feed(_beat("raas-eu-0", 3, 97.0, policy="policy"))
    t = s.tables()
    by_region = {r["region"]: r for r in t["regions"]}
    assert by_region["eu-west"]["max_behind"] == 2 and by_region["us-east"]["max_behind"] == 0
    assert by_region["eu-west"]["max_last_seen_s"] == 3.0
    assert DashboardState("j").tables()["regions"] == []  # no topology: no region table


def test_the_chart_library_is_installed_by_the_projects_own_files():
    """``make install`` (npm ci on astraflow/web's lock file) puts Chart.js where the server reads it."""
    lock = json.loads((ROOT / "astraflow" / "web" / "package-lock.json").read_text())
    pinned = lock["packages"]["node_modules/chart.js"]["version"]
    path = chart_library()
    assert f"Chart.js v{pinned}" in path.read_text()[:500]


def test_the_server_serves_the_page_its_library_and_the_state(bootstrap):
    """On a real broker, before the job has written anything: the page, Chart.js, ``/api/state``."""
    from astraflow.dashboard import Dashboard, DashboardError
    from astraflow.topics import JobTopics, ensure_topics
    with pytest.raises(DashboardError, match="no job 'nojob'"):
        Dashboard(bootstrap, "nojob").start()
    topics = JobTopics(job="dash-serve", policies=("policy",))
    ensure_topics(bootstrap, topics.specs())
    with Dashboard(bootstrap, "dash-serve") as dash:
        page = urllib.request.urlopen(dash.url, timeout=10).read().decode()
        assert '<script src="/vendor/chart.umd.js"></script>' in page
        lib = urllib.request.urlopen(dash.url + "vendor/chart.umd.js", timeout=10).read()
        assert lib == chart_library().read_bytes()
        state = json.loads(urllib.request.urlopen(dash.url + "api/state", timeout=10).read())
        assert state["job"] == "dash-serve" and state["policies"] == ["policy"] and state["state"] == "not started"
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(dash.url + "package.json", timeout=10)


def test_the_rollout_trainer_gap_and_the_masked_fraction_are_series():
    s = DashboardState("j", ("solver",), clock=Clock(1000.0))
    s.feed(Metric("trainer.solver", "trainer.behav_logp_gap", 0.02, 1, 1001.0))
    s.feed(Metric("trainer.solver", "trainer.behav_logp_gap_p99", 0.3, 1, 1001.0))
    s.feed(Metric("trainer.solver", "trainer.correction_masked_frac", 0.01, 1, 1001.0))
    s.feed(Metric("trainer.solver", "trainer.rollout_ratio_p50", 1.0, 1, 1001.0))  # in the topic, not charted
    series = s.snapshot()[0]["series"]
    assert series["logp_gap/solver"] == [(1, 0.02)] and series["logp_gap_p99/solver"] == [(1, 0.3)]
    assert series["masked_frac/solver"] == [(1, 0.01)]
    assert not any(k.startswith("rollout_ratio") for k in series)
