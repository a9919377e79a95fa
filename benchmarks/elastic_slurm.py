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
    """Autoscaling against each fixed size, on Slurm's device-hours."""
    auto = arms["autoscaling"]["slurm_device_hours"]["total"]
    out = {f"autoscaling_vs_{k}": round(auto / arms[k]["slurm_device_hours"]["total"] - 1, 4)
           for k in ("fixed_small", "fixed_large")}
    out["below_both"] = all(v < 0 for v in out.values())
    return out


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
                     f"{v['autoscaling_vs_fixed_large']:+.1%} (Slurm's device-hours)")
    return "\n".join(lines)


def main(a, ap) -> int:
    from astraflow.topics import EmbeddedBroker  # the Kafka client: only when the arms run
    from astraflow.topology.slurm_cluster import LocalSlurmCluster, missing_slurm
    if missing_slurm():
        ap.error(f"--slurm needs Slurm ({', '.join(missing_slurm())} missing): `make slurm` installs it")
    load_before = load_now()
    run_root = Path(a.run_root)
    arms: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="astraflow-slurm-") as d, \
            EmbeddedBroker(run_root / f"kafka-{int(time.time())}", heap="1g") as broker:
        for arm in a.arms:
            with LocalSlurmCluster(Path(d) / arm, cpus=16) as cluster:  # a cluster per arm: its own accounting
                topo = {**topology(arm, a), "slurm": {"conf": str(cluster.conf), "poll_s": 1}}
                row = run_arm(arm, a, broker.bootstrap_servers, run_root, topo=topo, backend="slurm")
                row.pop("emulated_accounts")
                arms[arm] = slurm_numbers(row, row.pop("slurm_summary", {}))
    section = {"quick": a.quick, **arms, "method": __doc__,
               "settings": {k: v for k, v in vars(a).items() if k not in ("out", "run_root")}}
    if all(k in arms for k in ARMS):
        section["verdict"] = verdict(arms)
    print(table(section))
    write_section(Path(a.out), "slurm", section, load_before, "elastic")
    return 0


# -- its results table: benchmarks/report.py renders every benchmark's from these ---------
from astraflow.benchmarks.report_format import Loader, heading, load_note  # noqa: E402 (kept with the table)


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
           f"Slurm's job completion log**, the heartbeats' count beside; one run{load_note(d)})", "",
           "| arm | wall s | pool mean/max | Slurm jobs | device-h (Slurm) | device-h (heartbeats) | audit |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for arm in (a for a in ARMS if a in d):
        r = d[arm]
        out.append(f"| {arm} | {r['wall_s']:.0f} | {r['pool_mean'] or 0:.1f} / {r['pool_max'] or 0:.0f} | "
                   f"{r['slurm_jobs']} | {r['slurm_device_hours'].get('total', float('nan')):.4f} | "
                   f"{r['total_device_hours']:.4f} | {'ok' if r['audit_ok'] else 'FAILED'} |")
    if "verdict" in d:
        v = d["verdict"]
        out += ["", f"Autoscaling against fixed_small {v['autoscaling_vs_fixed_small']:+.1%} and fixed_large "
                    f"{v['autoscaling_vs_fixed_large']:+.1%} device-hours by Slurm's accounting (the seed: −13 %)."]
    return out + [""]
