"""Cross-region training: MirrorMaker 2 into the remote region's own cluster vs direct reads.

Issue 32's comparison. The demo job (examples/arithmetic_grpo.yaml, the tiny model) runs
through ``astraflow launch`` with the trainer, the dataflow and one RaaS node in region A
and two RaaS nodes in region B, joined by an emulated link of 100 Mbit/s and 50 ms each way
(``topology/links.py``: ``tc tbf`` on a veth pair, one bucket per direction shared by every
connection, Toxiproxy latency). Four arms, {mirrored, direct} x {delta, full}:

* ``mirrored``: B has a Kafka cluster of its own that MirrorMaker 2 fills with the weights
  from A's (``kafka: embedded``); B's nodes read their weights there;
* ``direct``: B's nodes read the weights from A's cluster over the link (``kafka: region:A``);
* ``delta``: bf16 sparse deltas, a snapshot every ``--snapshot-every`` versions (the demo's 10);
* ``full``: a full bf16 snapshot every version and no deltas (``trainer.weight_transport: full``).

And ``single_region``: the same job with the three RaaS nodes in A, no link (the accuracy
reference).

Per arm: ``link_bytes_per_version`` (bytes the link carried toward B, measured at the link's
relays, divided by the versions published: the weights plus everything else B's nodes fetch,
tasks included), ``weights_crossings`` (those bytes over the payload bytes the trainer
published: ~1 = the weights crossed once, ~2 = once per B node), ``lag_versions_median`` and
``lag_versions_p95`` (at every rollout call of a B node, the newest version the trainer had
published then minus the version the node generated with), ``s_per_step`` (wall seconds per
trainer step, first to last step) and ``accuracy`` (held-out, at the last version) with its
standard error (``sqrt(p(1-p)/problems)``: each problem's pass rate averaged over ``k``
samples has at most a Bernoulli's variance, so this bounds the error from above).

Scaling: the link is the issue's (100 Mbit/s, 50 ms each way), the model and the run are
not: the tiny model's bf16 snapshot is ~3.3 MB (an 8B model's ~16 GB) and a run is
``--steps`` steps, so a version crosses in a fraction of a second instead of minutes. The
byte ratios (per version, crossings, delta vs full) carry over; lag and seconds per step
describe this small transfer-to-step ratio, not an 8B model's.

    python -m astraflow.benchmarks.cross_region            # ~15 min on a quiet 2-core box
    python -m astraflow.benchmarks.cross_region --quick    # a smoke run (numbers mean nothing)
    python -m astraflow.benchmarks.cross_region --lr 5e-6 --out benchmarks/results/cross_region_lr5e-6.json
                                                           # at a learning rate of RL on 7-8B models

Prints one table and writes ``benchmarks/results/cross_region.json``:
``{"mirrored": {"delta": {...}, "full": {...}}, "direct": {"delta": {...}, "full": {...}},
"single_region_accuracy": ..., ...}``. Building a link needs root, ``ip``, ``tc``, ``unshare``
and ``nsenter`` (``topology/links.py``'s ``check_capabilities``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import yaml

from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.run_metrics import read_rows
from astraflow.topology.netns import check_capabilities

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "cross_region.json"
A, B = "region-a", "region-b"
MODES, TRANSPORTS = ("mirrored", "direct"), ("delta", "full")
CELL_KEYS = ("link_bytes_per_version", "weights_crossings", "lag_versions_median", "lag_versions_p95",
             "s_per_step", "accuracy", "accuracy_se")


def job_settings(a: argparse.Namespace, transport: str) -> dict:
    """The job every arm runs, on top of examples/arithmetic_grpo.yaml."""
    return {
        "rollout": {"engine": {"threads": 1}},
        "trainer": {"steps": a.steps, "checkpoint_every": a.steps, "publish_dtype": "bfloat16",
                    "weight_transport": transport, "snapshot_every": a.snapshot_every,
                    "engine": {"threads": 1, **({"lr": a.lr} if a.lr is not None else {})}},
        "eval": {"every": 0, "problems": a.problems, "k": a.k, "threads": 1},
    }


def topology(mode: str | None, a: argparse.Namespace) -> dict:
    """Region A: dataflow, trainer, one RaaS node; region B: two RaaS nodes, on a cluster of its
    own (``mirrored``) or on A's (``direct``). ``mode=None``: the three nodes in A, no link."""
    def raas(count: int, host: str) -> dict:
        return {"component": "raas", "hosts": [host], "count": count, "threads": 1}
    home = {"kafka": "embedded", "hosts": ["a-0"], "pools": {
        "dataflow": {"component": "dataflow", "hosts": ["a-0"]},
        "trainer": {"component": "trainer", "hosts": ["a-0"], "threads": 1},
        "raas-a": raas(1 if mode else 3, "a-0")}}
    if mode is None:
        return {"name": "cross-region-single", "regions": {A: home}}
    return {"name": f"cross-region-{mode}",
            "regions": {A: home, B: {"kafka": "embedded" if mode == "mirrored" else f"region:{A}", "hosts": ["b-0"],
                                     "pools": {"raas-b": raas(2, "b-0")}}},
            "links": [{"between": [A, B], "bandwidth_mbps": a.bandwidth_mbps, "latency_ms": a.latency_ms}]}


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def percentile(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between order statistics."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def lags(rows: list[dict], nodes: set[str]) -> list[int]:
    """At every rollout call of a node in ``nodes`` (its ``raas.busy_s`` metric, stamped with the
    version it generated with), the newest version published by then minus that version."""
    published = sorted((r["ts"], r["step"]) for r in rows if r["name"] in ("weights.snapshot_bytes",
                                                                          "weights.delta_bytes"))
    out = []
    for r in rows:
        if r["name"] != "raas.busy_s" or r.get("label.node") not in nodes:
            continue
        newest = max((v for ts, v in published if ts <= r["ts"]), default=None)
        if newest is not None:
            out.append(max(0, newest - r["step"]))
    return out


def weight_numbers(rows: list[dict]) -> dict:
    """What one version's weights cost and why: the median delta payload, the fraction of bf16
    elements that changed (what a sparse delta can skip), and the snapshots' share per version
    (the periodic full snapshots cross the link too)."""
    deltas = [r["value"] for r in rows if r["name"] == "weights.delta_bytes"]
    snaps = [r["value"] for r in rows if r["name"] == "weights.snapshot_bytes"]
    changed = [r["value"] for r in rows if r["name"] == "weights.delta_changed_frac"]
    versions = {r["step"] for r in rows if r["name"] in ("weights.snapshot_bytes", "weights.delta_bytes")}
    return {"delta_bytes_median": round(statistics.median(deltas)) if deltas else None,
            "delta_changed_fraction_median": round(statistics.median(changed), 4) if changed else None,
            "snapshot_bytes_per_version": round(sum(snaps) / len(versions)) if versions else None}


def arm_numbers(summary: dict, rows: list[dict], problems: int) -> dict:
    """One arm's cell from its run summary and metrics rows."""
    train = sorted((r["step"], r["ts"]) for r in rows if r["name"] == "trainer.train_s")
    versions = {r["step"] for r in rows if r["name"] in ("weights.snapshot_bytes", "weights.delta_bytes")}
    published = sum(r["value"] for r in rows if r["name"] in ("weights.snapshot_bytes", "weights.delta_bytes"))
    acc = summary["accuracy_final"]
    out = {
        "versions_published": len(versions), "weights_bytes_published": int(published),
        "weights_bytes_per_version": round(published / len(versions)) if versions else None,
        "s_per_step": round((train[-1][1] - train[0][1]) / (train[-1][0] - train[0][0]), 3) if len(train) > 1 else None,
        "accuracy": acc, "accuracy_initial": summary["accuracy_initial"],
        "accuracy_se": round(math.sqrt(acc * (1 - acc) / problems), 4) if acc is not None else None,
        "steps_trained": summary["steps_trained"], "wall_s": summary["wall_s"],
        "audit_ok": summary["audit"]["ok"], "restarts": summary.get("restarts", {}),
        **weight_numbers(rows),
    }
    topo = summary.get("topology", {})
    links = topo.get("emulated_links", [])
    if links:
        (link,) = links
        b_nodes = {n for n in topo.get("weights_from", {}) if n.startswith("raas-b-")}
        lag = lags(rows, b_nodes)
        out.update({
            "link_bytes_down": link["bytes_down"], "link_bytes_up": link["bytes_up"],
            "link_bytes_per_version": round(link["bytes_down"] / len(versions)) if versions else None,
            "weights_crossings": round(link["bytes_down"] / published, 3) if published else None,
            "lag_versions_median": statistics.median(lag) if lag else None,
            "lag_versions_p95": round(percentile(lag, 0.95), 2) if lag else None, "lag_samples": len(lag),
            "region_b_weights_from": {n: topo["weights_from"][n] for n in sorted(b_nodes)},
        })
        mirror = topo.get("regional_clusters", {}).get(B, {}).get("mirror")
        if mirror:
            out["mirror"] = {k: mirror.get(k) for k in ("starts", "mirrored_records", "lag_records")}
    return out


SAME = ("steps", "delta_snapshot_every", "eval_problems", "eval_k", "seed", "quick", "lr")


def earlier_runs(out: Path, a: argparse.Namespace) -> dict[str, list[dict]]:
    """Every arm's repetitions already in ``out``, for ``--append``; a :class:`SystemExit`
    naming the setting when they were measured otherwise (mixing them would be one number
    from two experiments)."""
    if not out.is_file():
        raise SystemExit(f"--append: {out} does not exist; run without --append first")
    old = json.loads(out.read_text())
    s = old.get("settings", {})
    now = {"steps": a.steps, "delta_snapshot_every": a.snapshot_every, "eval_problems": a.problems, "eval_k": a.k,
           "seed": a.seed, "quick": a.quick, "lr": a.lr}
    link = s.get("link", {})
    differs = [k for k in SAME if s.get(k) != now[k]]
    differs += [k for k, v in (("bandwidth_mbps", a.bandwidth_mbps), ("latency_ms_each_way", a.latency_ms))
                if link.get(k) != v]
    if differs:
        raise SystemExit(f"--append: {out} was measured with other settings ({', '.join(differs)}): "
                         + ", ".join(f"{k} {s.get(k, link.get(k))!r} there" for k in differs))
    cells = {f"{m}_{t}": old[m][t] for m in MODES for t in TRANSPORTS}
    cells["single_region"] = old["single_region"]
    runs = {name: [dict(r) for r in cell["runs"]] for name, cell in cells.items()}
    for reps in runs.values():  # numbers added since those runs, from their own metrics where still on disk
        for r in reps:
            metrics = Path(r.get("run_dir", "")) / "metrics.jsonl"
            if "delta_changed_fraction_median" not in r and metrics.is_file():
                r.update(weight_numbers(read_rows(metrics.parent)))
    return runs


def run_arm(name: str, mode: str | None, transport: str, a: argparse.Namespace, run_root: Path,
            extra: dict | None = None) -> dict:
    """One launch of the job in ``mode`` with ``transport`` (``extra``: more job settings, merged last)."""
    from astraflow.config import load_config  # the job machinery (~1 s to import): only when an arm runs
    from astraflow.launcher import launch

    data = _merge(yaml.safe_load((ROOT / "examples" / "arithmetic_grpo.yaml").read_text()), job_settings(a, transport))
    data = _merge(data, extra or {})
    data.update(job=f"xr-{name.replace('_', '-')}-{int(time.time())}", seed=a.seed)
    run_dir = run_root / data["job"]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "job.yaml").write_text(yaml.safe_dump(data))
    (run_dir / "topology.yaml").write_text(yaml.safe_dump(topology(mode, a), sort_keys=False))
    cfg = load_config(run_dir / "job.yaml")
    print(f"[{name}] launching ({run_dir})", flush=True)
    t0 = time.monotonic()
    summary = launch(run_dir / "topology.yaml", cfg, run_dir=run_dir / "run", progress=False, timeout_s=a.timeout)
    rows = read_rows(run_dir / "run")
    out = {**arm_numbers(summary, rows, a.problems), "run_dir": str(run_dir / "run")}
    print(f"[{name}] done in {time.monotonic() - t0:.0f} s: " +
          ", ".join(f"{k} {out.get(k)}" for k in CELL_KEYS if out.get(k) is not None), flush=True)
    return out


def combine(runs: list[dict]) -> dict:
    """A cell: the median of each number over the repetitions, and every repetition."""
    cell: dict = {}
    for k in runs[0]:
        vals = [r[k] for r in runs if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
        if len(vals) == len(runs):
            cell[k] = statistics.median(vals)
            if len(runs) > 1:
                cell[k + "_range"] = [min(vals), max(vals)]
    cell["audit_ok"] = all(r["audit_ok"] for r in runs)
    cell["runs"] = runs
    return cell


def verdict(result: dict) -> dict:
    snap = result["mirrored"]["full"]["weights_bytes_per_version"]
    md = result["mirrored"]["delta"]
    single, se = result["single_region_accuracy"], result["single_region_accuracy_se"]
    return {
        # the issue's goals, as measured on this job
        "mirrored_delta_link_bytes_over_full_snapshot": round(md["link_bytes_per_version"] / snap, 4),
        # why: a delta's own payload, and the periodic snapshots' share of every version
        "mirrored_delta_payload_over_full_snapshot": (round(md["delta_bytes_median"] / snap, 4)
                                                      if md.get("delta_bytes_median") else None),
        "mirrored_snapshots_per_version_over_full_snapshot": (round(md["snapshot_bytes_per_version"] / snap, 4)
                                                              if md.get("snapshot_bytes_per_version") else None),
        "bf16_elements_changed_per_version": md.get("delta_changed_fraction_median"),
        "goal_delta_le_1_20_of_snapshot": md["link_bytes_per_version"] <= snap / 20,
        "goal_region_b_lag_p95_le_2": all(result[m][t]["lag_versions_p95"] <= 2 for m in MODES for t in TRANSPORTS),
        "goal_accuracy_within_2_se_of_single_region": all(
            abs(result[m][t]["accuracy"] - single) <= 2 * math.hypot(result[m][t]["accuracy_se"], se)
            for m in MODES for t in TRANSPORTS),
        "crossings_mirrored_over_direct": {t: round(result["mirrored"][t]["weights_crossings"]
                                                     / result["direct"][t]["weights_crossings"], 3)
                                           for t in TRANSPORTS},
        "audit_ok": all(result[m][t]["audit_ok"] for m in MODES for t in TRANSPORTS),
    }


def table(result: dict) -> str:
    lines = [f"{'arm':15} {'link B/version':>14} {'crossings':>9} {'lag p50':>7} {'lag p95':>7} {'s/step':>7} "
             f"{'accuracy':>14} {'audit':>5}"]
    for m in MODES:
        for t in TRANSPORTS:
            c = result[m][t]
            lines.append(f"{m + ' ' + t:15} {c['link_bytes_per_version']:14,.0f} {c['weights_crossings']:9.2f} "
                         f"{c['lag_versions_median']:7.1f} {c['lag_versions_p95']:7.1f} {c['s_per_step']:7.2f} "
                         f"{c['accuracy']:7.3f} ±{c['accuracy_se']:.3f} {'ok' if c['audit_ok'] else 'FAIL':>5}")
    s = result["single_region"]
    lines.append(f"{'single region':15} {'-':>14} {'-':>9} {'-':>7} {'-':>7} {s['s_per_step']:7.2f} "
                 f"{s['accuracy']:7.3f} ±{s['accuracy_se']:.3f} {'ok' if s['audit_ok'] else 'FAIL':>5}")
    v = result["verdict"]
    lines.append(f"mirrored delta bytes/version = {v['mirrored_delta_link_bytes_over_full_snapshot']:.3f} x a full "
                 f"bf16 snapshot; crossings mirrored/direct: delta {v['crossings_mirrored_over_direct']['delta']:.2f}, "
                 f"full {v['crossings_mirrored_over_direct']['full']:.2f}")
    if v.get("mirrored_delta_payload_over_full_snapshot") is not None:
        lines.append(f"  of which a delta's own payload {v['mirrored_delta_payload_over_full_snapshot']:.3f} "
                     f"({v['bf16_elements_changed_per_version']:.1%} of bf16 elements changed per version) and the "
                     f"periodic snapshots {v['mirrored_snapshots_per_version_over_full_snapshot']:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="trainer steps per arm")
    p.add_argument("--snapshot-every", type=int, default=10, help="the delta arms' snapshot interval (versions)")
    p.add_argument("--problems", type=int, default=200, help="held-out problems of the final evaluation")
    p.add_argument("--k", type=int, default=2, help="samples per held-out problem")
    p.add_argument("--bandwidth-mbps", type=float, default=100.0)
    p.add_argument("--latency-ms", type=float, default=50.0, help="each way")
    p.add_argument("--repeats", type=int, default=1, help="repetitions of every arm (the order rotates)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None,
                   help="the trainer's learning rate in every arm (default: the demo's 2e-4); a delta's size "
                        "follows it (benchmarks/delta_sparsity.py)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per launch")
    p.add_argument("--quick", action="store_true", help="a smoke run: 4 steps, 40 problems")
    p.add_argument("--run-root", type=Path, default=Path("runs") / "cross_region")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--append", action="store_true",
                   help="add --repeats repetitions to those already in --out, when they were measured with the same "
                        "settings (otherwise refused); --repeats 0 recomputes the file from its runs")
    a = p.parse_args(argv)
    if a.quick:
        a.steps, a.problems, a.snapshot_every = 4, 40, 2
    check_capabilities()
    load = load_now()
    arms = [("single_region", None, "delta")] + [(f"{m}_{t}", m, t) for m in MODES for t in TRANSPORTS]
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in arms}
    measured_before = json.loads(a.out.read_text()) if a.append and a.out.is_file() else {}
    elapsed_before = measured_before.get("settings", {}).get("elapsed_s", 0.0)
    if a.append:
        for name, reps in earlier_runs(a.out, a).items():
            runs[name] = list(reps)
    done = min(len(r) for r in runs.values())
    started = time.monotonic()
    new_runs = a.repeats > 0
    for rep in range(done, done + a.repeats):
        for name, mode, transport in arms[rep % len(arms):] + arms[:rep % len(arms)]:
            runs[name].append(run_arm(name, mode, transport, a, a.run_root))
    a.repeats = min(len(r) for r in runs.values())
    cells = {name: combine(r) for name, r in runs.items()}
    result: dict = {m: {t: cells[f"{m}_{t}"] for t in TRANSPORTS} for m in MODES}
    result["single_region_accuracy"] = cells["single_region"]["accuracy"]
    result["single_region_accuracy_se"] = cells["single_region"]["accuracy_se"]
    result["single_region"] = cells["single_region"]
    result["verdict"] = verdict(result)
    result["settings"] = {
        "job": "examples/arithmetic_grpo.yaml", "steps": a.steps, "publish_dtype": "bfloat16",
        "delta_snapshot_every": a.snapshot_every, "full": "a snapshot every version, no deltas", "eval_problems": a.problems,
        "eval_k": a.k, "repeats": a.repeats, "seed": a.seed, "quick": a.quick, "lr": a.lr,
        "nodes": {A: "dataflow, trainer, 1 RaaS node", B: "2 RaaS nodes"},
        "link": {"bandwidth_mbps": a.bandwidth_mbps, "latency_ms_each_way": a.latency_ms,
                 "emulation": "emulated: tc tbf on a veth pair per direction (shared by every connection) + "
                              "Toxiproxy latency (topology/links.py)"},
        "scaling": "the link is the issue's; the model (tiny, ~3.3 MB bf16 snapshot vs ~16 GB at 8B) and the run "
                   "(steps) are scaled down, so a version crosses in well under a second: byte ratios carry over, "
                   "lag and s/step describe this small transfer-to-step ratio",
        "elapsed_s": round(elapsed_before + time.monotonic() - started, 1),
    }
    print(table(result))
    if measured_before:  # the load and time of every measurement, not of this recomputation alone
        result["load_earlier_runs"] = measured_before.get("load_earlier_runs", []) + (
            [{"load": measured_before.get("load"), "created": measured_before.get("created")}] if new_runs else [])
    write_results(a.out, {"benchmark": "cross_region", **result}, load)
    if measured_before and not new_runs:  # nothing measured now: the file's load stays its measurements'
        data = json.loads(a.out.read_text())
        data["load"], data["created"] = measured_before.get("load"), measured_before.get("created")
        a.out.write_text(json.dumps(data, indent=2) + "\n")
    return 0


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, ReadmeRow, heading, load_note)


REPORT_TITLE = "Cross-region"
#: the results files this benchmark's sections come from: the default run, a 10 Mbit/s link, a low learning rate
REPORT_FILES = ("cross_region", "cross_region_10mbit", "cross_region_lr5e-6")


def report_rows(load: Loader) -> list[str]:
    """This benchmark's sections of docs/benchmarks.md, one per results file of :data:`REPORT_FILES`."""
    return [line for name in REPORT_FILES for line in _report_one(load(name), name)]


def _report_one(d: dict | None, name: str) -> list[str]:
    if not d:
        return []
    st = d["settings"]
    mbps, lr = d["settings"]["link"]["bandwidth_mbps"], st.get("lr")
    flag = ("" if mbps == 100 else f" --bandwidth-mbps {mbps:g}") + ("" if lr is None else f" --lr {lr:g}")
    flag += f" --out benchmarks/results/{name}.json" if flag else ""
    title = f"{REPORT_TITLE}{'' if mbps == 100 else f', a {mbps:g} Mbit/s link'}" \
            f"{'' if lr is None else f', learning rate {lr:g}'}"
    out = [*heading(title), f"**{title}** — "
           f"`python -m astraflow.benchmarks.cross_region{flag}` (the demo job, "
           f"{st['steps']} steps, bf16 weights; trainer, dataflow and 1 RaaS node in region A, 2 RaaS nodes in B; "
           f"an emulated link of {st['link']['bandwidth_mbps']:g} Mbit/s and {st['link']['latency_ms_each_way']:g} ms "
           "each way (`tc tbf` shared by every connection + Toxiproxy); mirrored: B's own cluster filled by "
           "MirrorMaker 2, direct: B's nodes read A's cluster over the link; delta: a snapshot every "
           f"{st['delta_snapshot_every']} versions, full: a snapshot every version and no deltas; {st['repeats']} "
           f"run{'s' if st['repeats'] > 1 else ''} per arm"
           f"{load_note(d)}. Bytes are those the link carried toward B per version published, tasks included; "
           "crossings = those bytes / the weight bytes published; lag = newest published version − the version a B "
           "node generated with, at each of its rollout calls; accuracy at the last version ± its standard error, "
           f"{st['eval_problems']} problems × {st['eval_k']})", "",
           "| arm | link bytes / version | crossings | lag p50 | lag p95 | s / step | accuracy | audit |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]

    def cell(c: dict, key: str, spec: str) -> str:
        """The median over the repetitions, and their range when there are several."""
        lo_hi = c.get(key + "_range")
        text = format(c[key], spec)
        return text if not lo_hi or lo_hi[0] == lo_hi[1] else \
            f"{text} ({format(lo_hi[0], spec)}–{format(lo_hi[1], spec)})"

    for m in ("mirrored", "direct"):
        for t in ("delta", "full"):
            c = d[m][t]
            out.append(f"| {m}, {t} | {cell(c, 'link_bytes_per_version', ',.0f')} | "
                       f"{cell(c, 'weights_crossings', '.2f')} | {cell(c, 'lag_versions_median', 'g')} | "
                       f"{cell(c, 'lag_versions_p95', 'g')} | {cell(c, 's_per_step', '.2f')} | "
                       f"{cell(c, 'accuracy', '.3f')} ± {c['accuracy_se']:.3f} | {'ok' if c['audit_ok'] else 'FAIL'} |")
    s = d["single_region"]
    out.append(f"| single region (3 nodes in A) | – | – | – | – | {cell(s, 's_per_step', '.2f')} | "
               f"{cell(s, 'accuracy', '.3f')} ± {s['accuracy_se']:.3f} | {'ok' if s['audit_ok'] else 'FAIL'} |")
    v = d["verdict"]
    out += ["", f"Mirrored delta bytes per version: {v['mirrored_delta_link_bytes_over_full_snapshot']:.3f} of a full "
                f"bf16 snapshot (goal ≤ 1/20: {'met' if v['goal_delta_le_1_20_of_snapshot'] else 'not met'}); "
                f"region-B lag p95 ≤ 2 versions: {'met' if v['goal_region_b_lag_p95_le_2'] else 'not met'}; accuracy "
                f"within 2 SE of single-region: {'met' if v['goal_accuracy_within_2_se_of_single_region'] else 'not met'}. "
                + (f"Of the mirrored delta bytes, a delta's own payload is {v['mirrored_delta_payload_over_full_snapshot']:.3f} "
                   f"of a snapshot ({v['bf16_elements_changed_per_version']:.1%} of bf16 elements changed per version, "
                   f"median) and the periodic snapshots {v['mirrored_snapshots_per_version_over_full_snapshot']:.3f}. "
                   if v.get("mirrored_delta_payload_over_full_snapshot") is not None else "")
                + f"Scaling: {st['scaling']}.", ""]
    return out


def readme_row(load: Loader) -> ReadmeRow | None:
    """The README's line: the bytes a region's link carries per version, mirrored deltas against direct reads."""
    d = load(REPORT_FILES[0])
    if not d:
        return None
    mb = {m: d[m]["delta"]["link_bytes_per_version"] / 1e6 for m in ("mirrored", "direct")}
    return ReadmeRow(REPORT_TITLE, f"MB over the {d['settings']['link']['bandwidth_mbps']:g} Mbit/s link to region B "
                     f"per version (bf16 deltas), median of {d['settings']['repeats']}",
                     f"region B mirrored {mb['mirrored']:.2f} · reading A directly {mb['direct']:.2f}", "lower")


if __name__ == "__main__":
    raise SystemExit(main())
