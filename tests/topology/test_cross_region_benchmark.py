"""benchmarks/cross_region.py's own arithmetic (the lag of region-B nodes, a cell from a run)
and the topologies it launches; the runs themselves are the benchmark's."""

from __future__ import annotations

import argparse
import json

import pytest

from astraflow.benchmarks import cross_region as xr
from astraflow.topology.plan import check_launchable, resolve
from astraflow.topology.validation import load_topology


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"steps": 10, "snapshot_every": 5, "problems": 100, "k": 2, "bandwidth_mbps": 100.0,
                                 "latency_ms": 50.0, "lr": None, **kw})


def _published(version: int, ts: float) -> dict:
    return {"name": "weights.delta_bytes" if version else "weights.snapshot_bytes", "step": version, "ts": ts,
            "value": 1000.0 if version else 5000.0}


def _call(node: str, version: int, ts: float) -> dict:
    return {"name": "raas.busy_s", "step": version, "ts": ts, "value": 1.0, "label.node": node}


def test_lag_is_the_newest_published_version_minus_the_one_generated_with_for_region_b_nodes_only():
    rows = [_published(0, 0.0), _published(1, 10.0), _published(2, 20.0), _published(3, 21.0),
            _call("raas-b-0", 0, 5.0),    # newest 0: lag 0
            _call("raas-b-0", 0, 15.0),   # newest 1: lag 1
            _call("raas-b-1", 1, 22.0),   # newest 3: lag 2
            _call("raas-a-0", 0, 22.0),   # not in region B: not counted
            _call("raas-b-1", 3, -1.0)]   # before anything was published: no sample
    assert sorted(xr.lags(rows, {"raas-b-0", "raas-b-1"})) == [0, 1, 2]
    assert xr.percentile([0, 1, 2, 3, 4], 0.95) == pytest.approx(3.8)


def test_a_cell_counts_the_links_bytes_per_version_and_the_crossings():
    rows = [_published(v, float(10 * v)) for v in range(4)] + [
        {"name": "trainer.train_s", "step": s, "ts": 10.0 * s + 1, "value": 1.0} for s in range(1, 4)]
    rows += [_call("raas-b-0", 2, 25.0)]
    summary = {"accuracy_final": 0.36, "accuracy_initial": 0.2, "steps_trained": 3, "wall_s": 50.0,
               "audit": {"ok": True}, "restarts": {},
               "topology": {"emulated_links": [{"bytes_down": 16_000, "bytes_up": 500}],
                            "weights_from": {"raas-b-0": {"cluster": "region-b (own)"}, "raas-a-0": {"cluster": "home"}},
                            "regional_clusters": {}}}
    cell = xr.arm_numbers(summary, rows, problems=100)
    assert cell["weights_bytes_published"] == 8000 and cell["versions_published"] == 4
    assert cell["link_bytes_per_version"] == 4000 and cell["weights_crossings"] == 2.0
    assert cell["lag_versions_median"] == 0 and cell["s_per_step"] == 10.0
    assert cell["accuracy_se"] == pytest.approx((0.36 * 0.64 / 100) ** 0.5, abs=1e-4)
    assert list(cell["region_b_weights_from"]) == ["raas-b-0"]


@pytest.mark.parametrize("mode", [None, "mirrored", "direct"])
def test_every_arms_topology_is_launchable(tmp_path, mode):
    path = tmp_path / "t.yaml"
    path.write_text(json.dumps(xr.topology(mode, _args())))
    plan = resolve(load_topology(path))
    check_launchable(plan)
    raas = sorted(n.node_id for n in plan.nodes if n.role == "raas")
    assert raas == (["raas-a-0", "raas-a-1", "raas-a-2"] if mode is None
                    else ["raas-a-0", "raas-b-0", "raas-b-1"])
    mirrored = [c.declared_by for c in plan.mirrored_clusters()]
    assert mirrored == (["region-b"] if mode == "mirrored" else [])
    if mode is not None:
        (link,) = plan.emulated_links()
        assert (link["bandwidth_mbps"], link["latency_ms"]) == (100.0, 50.0)


def test_the_full_arm_publishes_snapshots_only_and_the_delta_arm_deltas():
    assert xr.job_settings(_args(), "full")["trainer"]["weight_transport"] == "full"
    assert "lr" not in xr.job_settings(_args(), "delta")["trainer"]["engine"]  # the demo's own
    assert xr.job_settings(_args(lr=5e-6), "full")["trainer"]["engine"]["lr"] == 5e-6
    delta = xr.job_settings(_args(), "delta")["trainer"]
    assert delta["weight_transport"] == "delta" and delta["snapshot_every"] == 5
    assert delta["publish_dtype"] == "bfloat16"


def test_append_adds_to_repetitions_measured_the_same_way_and_refuses_others(tmp_path):
    cell = {"runs": [{"accuracy": 0.3}]}
    out = tmp_path / "cross_region.json"
    out.write_text(json.dumps({
        "mirrored": {"delta": cell, "full": cell}, "direct": {"delta": cell, "full": cell}, "single_region": cell,
        "settings": {"steps": 20, "delta_snapshot_every": 10, "eval_problems": 200, "eval_k": 2, "seed": 0,
                     "quick": False, "link": {"bandwidth_mbps": 100.0, "latency_ms_each_way": 50.0}}}))
    a = argparse.Namespace(steps=20, snapshot_every=10, problems=200, k=2, seed=0, quick=False, bandwidth_mbps=100.0,
                           latency_ms=50.0, lr=None)  # files from before --lr: the demo's learning rate
    runs = xr.earlier_runs(out, a)
    assert set(runs) == {"mirrored_delta", "mirrored_full", "direct_delta", "direct_full", "single_region"}
    assert runs["single_region"] == [{"accuracy": 0.3}]
    with pytest.raises(SystemExit, match="latency_ms_each_way"):
        xr.earlier_runs(out, argparse.Namespace(**{**vars(a), "latency_ms": 25.0}))
    with pytest.raises(SystemExit, match="lr"):
        xr.earlier_runs(out, argparse.Namespace(**{**vars(a), "lr": 5e-6}))
    with pytest.raises(SystemExit, match="does not exist"):
        xr.earlier_runs(tmp_path / "none.json", a)
