"""Elastic RaaS pools: the same job on a small fixed pool, a large fixed pool, and autoscaling.

The seed's claim: an autoscaled rollout pool costs fewer device-hours than either fixed
size at equal accuracy (Qwen3-14B math: fixed 6 GPUs 358.0 GPU-h, fixed 11 359.2,
autoscaling 312.0, −13 %). Here every arm runs the arithmetic demo job through
``astraflow launch`` on one topology that differs only in the RaaS pool:

* ``fixed_small`` — ``--small`` nodes (default 1);
* ``fixed_large`` — ``--large`` nodes (default 4);
* ``autoscaling`` — starts at ``--small``, the autoscaler free between small and large.

Devices are emulated on this CPU-only box (labelled so in the output): the trainer node
holds ``--trainer-devices`` devices of kind ``h100-emulated`` and every training step is
stretched x``--trainer-slowdown``; a RaaS node holds one ``a10-emulated`` device and every
rollout call is stretched x``--raas-slowdown``. The stretch is sleep, so N emulated nodes
behave like N devices even on 2 cores: only the unstretched compute (1/slowdown of a
node's busy time) competes for the cores. Every node has one torch thread. Device-hours
come from the heartbeats (``topology/accounting.py``: from a node's start, boot included,
to its last beat), so idle nodes and a waiting trainer cost what they would on a cluster.

Per arm: wall time, trainer wait fraction (waiting / (waiting + training) over steps 2..N:
step 1 waits for every process to boot), rollout / trainer / total device-hours and cost,
held-out accuracy at the last version, the pool's largest and time-weighted mean size,
and the conservation audit. Prints one table and writes ``benchmarks/results/elastic.json``
(``{"fixed_small": {...}, "fixed_large": {...}, "autoscaling": {...}, ...}``) and
``elastic.png`` (pool size and trainer wait fraction over time, autoscaling arm).
``--quick`` is a smoke run of a few steps (its numbers mean nothing).

``--emulated`` runs the same three arms with the trainer and RaaS pools on cost-model
emulated accelerators instead (``elastic_emulated.py``: pool sizes from a printed rule,
device-hours in modelled hours) and writes the JSON's ``emulated`` section.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from astraflow.benchmarks import elastic_emulated, elastic_slurm
from astraflow.benchmarks.elastic_arms import ARMS, ROOT, plot, run_arm
from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.run_metrics import read_rows

RESULTS = ROOT / "benchmarks" / "results" / "elastic.json"


def verdict(arms: dict) -> dict:
    auto = arms["autoscaling"]["total_device_hours"]
    out = {f"autoscaling_vs_{k}": round(auto / arms[k]["total_device_hours"] - 1, 4)
           for k in ("fixed_small", "fixed_large")}
    out["below_both"] = all(v < 0 for v in out.values())
    accs = [arms[k]["accuracy"] for k in ARMS if arms[k]["accuracy"] is not None]
    out["accuracy_spread"] = round(max(accs) - min(accs), 4) if accs else None
    return out


def table(result: dict) -> str:
    lines = [f"{'arm':12} {'wall s':>7} {'wait':>6} {'pool':>9} {'rollout dh':>11} {'trainer dh':>11} "
             f"{'total dh':>9} {'cost':>7} {'acc':>6}"]
    for arm in ARMS:
        r = result[arm]
        lines.append(f"{arm:12} {r['wall_s']:7.0f} {r['trainer_wait_frac'] or 0:6.2f} "
                     f"{r['pool_mean'] or 0:4.1f}/{r['pool_max'] or 0:<4.0f} {r['rollout_device_hours']:11.4f} "
                     f"{r['trainer_device_hours']:11.4f} {r['total_device_hours']:9.4f} {r['cost']:7.3f} "
                     f"{r['accuracy'] if r['accuracy'] is not None else float('nan'):6.3f}")
    v = result["verdict"]
    lines.append(f"autoscaling vs fixed_small {v['autoscaling_vs_fixed_small']:+.1%}, vs fixed_large "
                 f"{v['autoscaling_vs_fixed_large']:+.1%} total device-hours (seed: -13%)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="trained steps per arm (default 30, ~20 min for the "
                                                             "three; --emulated: 15)")
    ap.add_argument("--small", type=int, default=None, help="fixed_small's nodes, the autoscaler's min (default 1; "
                                                             "--emulated: the pricing rule's)")
    ap.add_argument("--large", type=int, default=None, help="fixed_large's nodes, the autoscaler's max (default 4; "
                                                             "--emulated: the pricing rule's)")
    # The tiny model's rollout call (2 tasks x 8 samples) is ~0.04 s of compute and its training
    # step ~0.2-0.7 s on a loaded box: stretched x30 and x10, a batch is ~5 node-seconds of
    # rollout per 2-7 s step, so one node starves the trainer and four leave much of the pool idle.
    ap.add_argument("--raas-slowdown", type=float, default=30.0, help="emulated RaaS device: rollout stretch")
    ap.add_argument("--trainer-slowdown", type=float, default=10.0, help="emulated trainer device: step stretch")
    ap.add_argument("--trainer-devices", type=int, default=None, help="devices the trainer node holds (default 4; "
                    "--emulated: the fewest its training states fit on)")
    ap.add_argument("--raas-cost", type=float, default=1.0, help="cost per RaaS device-hour")
    ap.add_argument("--trainer-cost", type=float, default=1.0, help="cost per trainer device-hour")
    ap.add_argument("--interval", type=float, default=5.0, help="autoscaler: seconds between decisions")
    ap.add_argument("--window", type=float, default=60.0, help="autoscaler: measurement window, s (several steps)")
    ap.add_argument("--cooldown", type=float, default=60.0, help="autoscaler: seconds between actions (> a node's "
                                                                  "start-up on this box)")
    ap.add_argument("--scale-up-wait", type=float, default=None, help="autoscaler: grow above this trainer wait "
                    "fraction (default: the autoscaler's, 0.10)")
    ap.add_argument("--problems", type=int, default=100, help="held-out problems (x2 samples each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS),
                    help="arms to run, in this order (the box's load drifts: vary it between runs)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per arm, seconds")
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 steps, tiny evaluation")
    ap.add_argument("--repeats", type=int, default=None, help="--emulated: repetitions of every arm, interleaved "
                    "(default 3; 1 with --quick)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--run-root", default=str(ROOT / "runs" / "bench-elastic"))
    ap.add_argument("--emulated", action="store_true", help="the arms on cost-model emulated accelerators "
                    "(elastic_emulated.py): the JSON's emulated section, device-hours in modelled hours")
    ap.add_argument("--profile", default="h100-qwen3-8b", help="--emulated: emulation profile (emulation/profiles.yaml)")
    ap.add_argument("--dilation", type=float, default=0.25, help="--emulated: wall seconds per modelled second "
                    "(0.25: a RaaS call's hold, ~7 s, stays under the task consumer's 10 s session timeout)")
    ap.add_argument("--token-scale", type=int, default=512, help="--emulated: modelled tokens per generated one")
    ap.add_argument("--prompt-token-scale", type=int, default=16, help="--emulated: modelled tokens per prompt one")
    ap.add_argument("--slurm", action="store_true", help="the CPU arms through the Slurm backend on a single-node "
                    "cluster of their own (elastic_slurm.py): the JSON's slurm section, Slurm's device-hours")
    a = ap.parse_args(argv)
    if a.emulated:
        return elastic_emulated.main(a, ap)
    a.steps, a.small, a.large = a.steps or 30, a.small or 1, a.large or 4
    a.trainer_devices = a.trainer_devices or 4
    if a.small < 1 or a.large <= a.small:
        ap.error(f"need 1 <= --small < --large, got {a.small} and {a.large}")
    if a.quick:
        a.steps, a.problems, a.window, a.cooldown, a.interval = 4, 10, 10.0, 10.0, 2.0
    if a.slurm:
        return elastic_slurm.main(a, ap)
    from astraflow.topics import EmbeddedBroker  # the Kafka client (~0.7 s to import): only when the arms run
    load_before = load_now()
    run_root = Path(a.run_root)
    arms: dict[str, dict] = {}
    with EmbeddedBroker(run_root / f"kafka-{int(time.time())}", heap="1g") as broker:
        for arm in a.arms:
            arms[arm] = run_arm(arm, a, broker.bootstrap_servers, run_root)
            arms[arm].pop("emulated_accounts")  # the slowdown devices' holds: not what these arms report
    out = Path(a.out)
    result = {"benchmark": "elastic", "quick": a.quick, **arms,
              "settings": {k: v for k, v in vars(a).items() if k not in ("out", "run_root")},
              "emulation": (f"devices emulated on CPU: trainer step x{a.trainer_slowdown:g}, RaaS rollout call "
                            f"x{a.raas_slowdown:g} (sleep); one torch thread per node"),
              "contention": ("only 1/slowdown of a node's busy time is compute, so the cores are shared by at most "
                             "the trainer's and the nodes' unstretched compute; on a busy 2-core box that compute "
                             "takes longer in the larger pools, which lengthens every arm's steps somewhat "
                             "(see load)")}
    if all(k in arms for k in ARMS):
        result["verdict"] = verdict(arms)
        print(table(result))
    if "autoscaling" in arms:
        plot(out.with_suffix(".png"), read_rows(Path(arms["autoscaling"]["run_dir"]) / "run"))
    write_results(out, result, load_before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
