"""The elastic demo's three arms through the Slurm backend (``elastic --slurm``; issue 61).

The same arms as ``elastic.py`` (``fixed_small``, ``fixed_large``, ``autoscaling``: the arithmetic
demo job, the trainer and RaaS devices emulated by slowdown), each run with ``astraflow launch
--backend slurm`` on a single-node Slurm cluster of its own in a temporary directory
(:class:`~astraflow.topology.slurm_cluster.LocalSlurmCluster`: Debian's slurm-wlm and munge,
``make slurm``): every node a Slurm job, the autoscaler adding and releasing RaaS nodes with
``sbatch`` / ``scancel --signal=TERM``. Device-hours come from **Slurm's own accounting** of
the jobs (its job completion log: each job's elapsed time x the devices its pool's nodes
hold), beside the heartbeats' count of the same run; the conservation audit of each arm.

Writes the ``slurm`` section of ``benchmarks/results/elastic.json`` (the CPU arms stay).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from astraflow.benchmarks.elastic_arms import ARMS, run_arm, topology
from astraflow.benchmarks.lib.results import load_now, write_section
from astraflow.benchmarks.lib.stats import spread


def slurm_numbers(row: dict, summary_slurm: dict) -> dict:
    """One arm's figures from Slurm's accounting (``summary.json``'s ``slurm`` section)."""
    hours = summary_slurm.get("device_hours") or {}
    jobs = summary_slurm.get("jobs") or {}
    return {**row, "slurm_device_hours": {k: round(hours[k], 5) for k in ("rollout", "trainer", "total")
                                          if k in hours},
            "slurm_cost": round(hours.get("cost", 0.0), 4) if hours else None,
            "slurm_jobs": sum(len(v) for v in jobs.values()),
            "slurm_device_hours_unavailable": summary_slurm.get("device_hours_unavailable")}


def verdict(arms: dict) -> dict:
    """Autoscaling against each fixed size on Slurm's device-hours, repetition by repetition (the
    k-th runs of the arms ran one after another), and their median (min–max)."""
    reps = {k: arms[k].get("repetitions", [arms[k]]) for k in ("autoscaling", "fixed_small", "fixed_large")}
    auto = [r["slurm_device_hours"]["total"] for r in reps["autoscaling"]]
    out: dict = {}
    for k in ("fixed_small", "fixed_large"):
        sp = spread([a / r["slurm_device_hours"]["total"] - 1 for a, r in zip(auto, reps[k])])
        out[f"autoscaling_vs_{k}"] = round(sp["median"], 4)
        out[f"autoscaling_vs_{k}_spread"] = sp
    out["below_both"] = out["autoscaling_vs_fixed_small"] < 0 and out["autoscaling_vs_fixed_large"] < 0
    out["below_both_every_repetition"] = all(max(out[f"autoscaling_vs_{k}_spread"]["runs"]) < 0
                                             for k in ("fixed_small", "fixed_large"))
    return out


def summarize(rows: list[dict]) -> dict:
    """An arm over its repetitions: the repetition of median Slurm device-hours as its row, each
    under ``repetitions``, and the spread of Slurm's and the heartbeats' totals."""
    ranked = sorted(rows, key=lambda r: r["slurm_device_hours"]["total"])
    return {**ranked[(len(ranked) - 1) // 2], "repetitions": rows,
            "slurm_total_spread": spread([r["slurm_device_hours"]["total"] for r in rows]),
            "heartbeat_total_spread": spread([r["total_device_hours"] for r in rows]),
            "audit_ok_every_repetition": all(r["audit_ok"] for r in rows)}


def table(section: dict) -> str:
    lines = ["Elastic arms through Slurm (device-hours from Slurm's job completion log; heartbeats beside)",
             f"{'arm':12} {'wall s':>7} {'pool':>9} {'jobs':>5} {'slurm dh':>9} {'heartbeat dh':>13} {'audit':>6}"]
    for arm in (a for a in ARMS if a in section):
        r = section[arm]
        lines.append(f"{arm:12} {r['wall_s']:7.0f} {r['pool_mean'] or 0:4.1f}/{r['pool_max'] or 0:<4.0f} "
                     f"{r['slurm_jobs']:5d} {r['slurm_device_hours'].get('total', float('nan')):9.4f} "
                     f"{r['total_device_hours']:13.4f} {'ok' if r['audit_ok'] else 'FAIL':>6}")
    if "verdict" in section:
        v = section["verdict"]
        lines.append(f"autoscaling vs fixed_small {v['autoscaling_vs_fixed_small']:+.1%}, vs fixed_large "
                     f"{v['autoscaling_vs_fixed_large']:+.1%} (Slurm's device-hours, median of the paired repetitions)")
    return "\n".join(lines)


def main(a, ap) -> int:
    from astraflow.topics import EmbeddedBroker  # the Kafka client: only when the arms run
    from astraflow.topology.slurm_cluster import LocalSlurmCluster, missing_slurm
    if missing_slurm():
        ap.error(f"--slurm needs Slurm ({', '.join(missing_slurm())} missing): `make slurm` installs it")
    load_before = load_now()
    run_root = Path(a.run_root)
    repeats = a.repeats or (1 if a.quick else 3)
    reps: dict[str, list[dict]] = {arm: [] for arm in a.arms}
    with tempfile.TemporaryDirectory(prefix="astraflow-slurm-") as d, \
            EmbeddedBroker(run_root / f"kafka-{int(time.time())}", heap="1g") as broker:
        for rep in range(repeats):  # the arms interleaved: the box's load drifts alike for each
            for arm in a.arms:
                # a cluster per run: its own job completion log
                with LocalSlurmCluster(Path(d) / f"{arm}-{rep}", cpus=16) as cluster:
                    topo = {**topology(arm, a), "slurm": {"conf": str(cluster.conf), "poll_s": 1}}
                    row = run_arm(arm, a, broker.bootstrap_servers, run_root, topo=topo, backend="slurm")
                    row.pop("emulated_accounts")
                    reps[arm].append(slurm_numbers(row, row.pop("slurm_summary", {})))
    arms = {arm: summarize(rows) for arm, rows in reps.items()}
    section = {"quick": a.quick, "repeats": repeats, **arms, "method": __doc__,
               "settings": {k: v for k, v in vars(a).items() if k not in ("out", "run_root")}}
    if all(k in arms for k in ARMS):
        section["verdict"] = verdict(arms)
    print(table(section))
    write_section(Path(a.out), "slurm", section, load_before, "elastic")
    return 0


# -- its results table: benchmarks/report.py renders every benchmark's from these ---------
from astraflow.benchmarks.report_format import Loader, heading, load_note, fmt_spread as _sp  # noqa: E402


REPORT_TITLE = "Elastic RaaS pools through Slurm"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md: the ``slurm`` section of ``elastic.json``
    (none for a quick run)."""
    d = (load("elastic") or {}).get("slurm")
    if not d or d.get("quick"):
        return []
    st = d["settings"]
    out = [*heading(REPORT_TITLE),
           f"**Elastic RaaS pools through Slurm** — `python -m astraflow.benchmarks.elastic --slurm` (the CPU arms, "
           f"{st['steps']} steps each, every node a Slurm job on a single-node cluster of the benchmark's own; the "
           f"trainer on {st['trainer_devices']} and each RaaS node on 1 slowdown-emulated device; **device-hours from "
           f"Slurm's job completion log**, the heartbeats' count beside; the median repetition of "
           f"{d.get('repeats', 1)}, arms interleaved{load_note(d)})", "",
           "| arm | wall s | pool mean/max | Slurm jobs | device-h (Slurm) | device-h (heartbeats) | audit |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for arm in (a for a in ARMS if a in d):
        r = d[arm]
        slurm = _sp(r["slurm_total_spread"], ".4f") if "slurm_total_spread" in r else \
            f"{r['slurm_device_hours'].get('total', float('nan')):.4f}"
        beats = _sp(r["heartbeat_total_spread"], ".4f") if "heartbeat_total_spread" in r else f"{r['total_device_hours']:.4f}"
        ok = r.get("audit_ok_every_repetition", r["audit_ok"])
        out.append(f"| {arm} | {r['wall_s']:.0f} | {r['pool_mean'] or 0:.1f} / {r['pool_max'] or 0:.0f} | "
                   f"{r['slurm_jobs']} | {slurm} | {beats} | {'ok' if ok else 'FAILED'} |")
    if "verdict" in d:
        v = d["verdict"]
        rng = lambda k: (f" ({min(v[k + '_spread']['runs']):+.1%} to {max(v[k + '_spread']['runs']):+.1%})"  # noqa: E731
                         if k + "_spread" in v else "")
        out += ["", f"Autoscaling against fixed_small {v['autoscaling_vs_fixed_small']:+.1%}"
                    f"{rng('autoscaling_vs_fixed_small')} and fixed_large {v['autoscaling_vs_fixed_large']:+.1%}"
                    f"{rng('autoscaling_vs_fixed_large')} device-hours by Slurm's accounting, median of the paired "
                    f"repetitions (the seed: −13 %)."]
    return out + [""]
