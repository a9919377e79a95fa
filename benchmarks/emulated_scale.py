"""The demo job at 8 to 64 emulated devices: does the schedule scale? (``emulated_scale.py``).

Weak scaling of the single-policy demo job (``examples/arithmetic_grpo.yaml``, async) on
``N`` emulated devices of ``--profile`` (default H100 with the Qwen3-8B shape), N in
``--devices`` (8, 16, 32, 64): half the devices roll out, on RaaS nodes of at most
``--devices-per-node`` (each node one process whose engine stands for that many replicas),
half train (one data-parallel trainer); the batch grows with N (16 prompts x 8 samples per 8
devices), so each device has the same work at every N. A node takes its share of a batch per
poll and keeps two polls in flight (``rollout.polls_in_flight``): the partitions do not
split a batch's tasks evenly, and the rest of a node's share joins the running batch
instead of waiting for a poll of its own. The tiny model does every token and
gradient; every engine call is held for its modelled time (``emulation/cost.py``), ``dilation``
wall seconds per modelled second, raised with N (``--dilation`` x N / 8) so the real work
stays a small share of each hold on this machine's cores. Every time is **modelled seconds,
emulated**, not a GPU measurement.

Per device count, ``--repeats`` runs, same seeds: **samples/s** (samples trained per modelled
second, steady state: end of step 2 to the last step); the **lower bound** per step, the
busiest resource's modelled work per step from the run's own accounts (each RaaS node's
generate and weight loads scaled to one batch of the episodes it rolled out, those of polls
fenced by a rebalance and redone elsewhere included, so redone work never counts as needed;
the trainer's steps); the
**scheduling efficiency** = bound / measured s per step; and **where the rest goes**: the
trainer's wait for its next batch (``trainer.wait_s``, the dataflow and Kafka path) and
the nodes' weight loads, per step, and the task group's rebalances (each fences the polls in
flight). **Linearity** = samples/s at N / (samples/s at 8 x N/8).

Prints one table; writes ``benchmarks/results/emulated_scale.json``.
"""

from __future__ import annotations

import argparse
import json
import time
import types
from pathlib import Path

import yaml

from astraflow.benchmarks.lib.device_split import split_from_runs
from astraflow.benchmarks.lib.emulated import cpu_fractions, episodes_fenced, episodes_worked, overruns, resource_work
from astraflow.benchmarks.lib.results import load_now, write_results, write_section
from astraflow.benchmarks.lib.run_metrics import read_rows, read_summary, total
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.benchmarks.lib.steady import WINDOW_RULE, steady_steps, steady_window, steps_for_window
from astraflow.benchmarks.lib.table import print_header
from astraflow.benchmarks.multi_policy_arms import write_config
from astraflow.benchmarks.multi_policy_emulated_arms import SEED_SHAPE, split_config
from astraflow.benchmarks.multi_policy_runs import analyse_team
from astraflow.emulation.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "emulated_scale.json"
CONFIG = ROOT / "examples" / "arithmetic_grpo.yaml"
#: prompts per batch per 8 devices (the demo's batch at 8)
GROUPS_PER_8 = 16


def layout(n: int, per_node: int) -> dict:
    """Rollout and trainer devices of ``n``, and the RaaS nodes that hold the rollout ones."""
    rollout, trainer = n // 2, n - n // 2
    nodes = max(1, -(-rollout // per_node))
    if rollout % nodes:
        raise ValueError(f"{rollout} rollout devices do not split evenly over {nodes} nodes of <= {per_node}")
    groups = GROUPS_PER_8 * n // 8
    return {"devices": n, "rollout_devices": rollout, "trainer_devices": trainer, "nodes": nodes,
            "devices_per_node": rollout // nodes, "groups_per_batch": groups, "tasks_per_call": groups // nodes}


def overrides(args, lay: dict, job: str) -> dict:
    dilation = args.dilation * lay["devices"] / 8
    dev = lambda n: {"kind": "emulated", "profile": args.profile, "count": n, "dilation": dilation,  # noqa: E731
                     "token_scale": args.token_scale, "prompt_token_scale": args.prompt_token_scale}
    return {"mode": "async", "job": job, "trainer.steps": args.steps, "eval.every": 0, "eval.problems": 50,
            "eval.k": 1, "trainer.cpu_nice": 0, "rollout.nodes": lay["nodes"], "rollout.polls_in_flight": 2,
            "rollout.tasks_per_call": lay["tasks_per_call"], "dataflow.groups_per_batch": lay["groups_per_batch"],
            "kafka.task_partitions": max(8, lay["nodes"]),
            "rollout.device": dev(lay["devices_per_node"]), "trainer.device": dev(lay["trainer_devices"])}


def analyse(run_dir: Path, dilation: float, lay: dict, n_samples: int) -> dict:
    rows, step_ts, first, last = steady_steps(run_dir)
    steps = max(step_ts)
    per_step = (step_ts[last] - step_ts[first]) / (last - first) / dilation
    summary = read_summary(run_dir)
    episodes = total(rows, "raas.tasks")
    # A fenced poll's episodes were rolled out (their work is in the device totals) and redone
    # by the partition's owner, and the polls in flight at the stop were partly rolled out: the
    # work per batch is priced over every episode worked on, or the "bound" would count that
    # work as needed and exceed the time measured.
    fenced = episodes_fenced(rows)
    em = summary.get("emulated", {})
    work = resource_work(summary, episodes_worked(rows), lay["groups_per_batch"], steps)
    window = [r for r in rows if step_ts[first] < r["ts"] <= step_ts[last]]
    wait = sum(float(r["value"]) for r in window if r["name"] == "trainer.wait_s") / (last - first) / dilation
    loads = sum(c.get("weight_load", {}).get("modelled_s", 0.0) for k, c in em.items() if not k.startswith("trainer"))
    bound = max(work.values())
    return {"s_per_step": per_step, "samples_per_s": lay["groups_per_batch"] * n_samples / per_step,
            "lower_bound_s_per_step": bound, "scheduling_efficiency": bound / per_step,
            "busiest": max(work, key=work.get), "work_by_resource": work,
            "trainer_wait_s_per_step": wait,
            "weight_load_s_per_step_per_node": loads / max(1, lay["nodes"]) / steps,
            "episodes_per_trained_group": episodes / (steps * lay["groups_per_batch"]),
            "fenced_episodes": fenced, "task_group_rebalances": rebalances(rows),
            "cpu_fraction": cpu_fractions(em), "overruns": overruns(em), "run_dir": str(run_dir),
            "wall_s": summary.get("wall_s")}


def rebalances(rows: list[dict]) -> int:
    """How often the RaaS nodes' task group rebalanced in the run (``raas.task_group_generation``,
    from the nodes' heartbeats): each rebalance fences the polls in flight of every node."""
    gens = [int(r["value"]) for r in rows if r["name"] == "raas.task_group_generation"]
    return max(gens) - min(gens) if gens else 0


def one(args, broker, lay: dict, rep: int) -> dict:
    from astraflow.config import load_config  # the job machinery (~1 s to import): only when a count runs
    from astraflow.launcher import run_job
    job = f"bench-scale-{lay['devices']}-{int(time.time())}-{rep}"
    ov = overrides(args, lay, job)
    cfg = load_config(args.config, ov)
    run_dir = Path(args.run_root) / job
    print(f"--- {lay['devices']} devices, repetition {rep + 1}: {lay['nodes']} node(s) x "
          f"{lay['devices_per_node']} + trainer {lay['trainer_devices']} ({job})", flush=True)
    run_job(cfg, bootstrap=broker.bootstrap_servers, run_dir=run_dir, progress=False, timeout_s=args.run_timeout,
            overrides=[f"{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in ov.items()])
    return analyse(run_dir, ov["rollout.device"]["dilation"], lay, cfg.rollout.n_samples)


KEYS = ("s_per_step", "samples_per_s", "lower_bound_s_per_step", "scheduling_efficiency",
        "trainer_wait_s_per_step", "weight_load_s_per_step_per_node", "episodes_per_trained_group",
        "fenced_episodes", "task_group_rebalances")


def aggregate(rows: dict[int, list[dict]], keys: tuple[str, ...] = KEYS) -> dict:
    """Per device count, the spread of each of ``keys`` over its repetitions, and the linearity
    against the smallest count (paired run by run; median against median while a run is
    still partial and the counts have unequal repetitions)."""
    out = {}
    base = spread([r["samples_per_s"] for r in rows[min(rows)]])
    for n, reps in rows.items():
        agg = {k: spread([r[k] for r in reps]) for k in keys}
        agg["max_cpu_fraction"] = spread([max(r["cpu_fraction"].values(), default=0.0) for r in reps])
        agg["overruns"] = spread([r["overruns"] for r in reps])
        ideal = {**base, **{k: v * n / min(rows) for k, v in base.items() if k in ("median", "min", "max")},
                 "runs": [v * n / min(rows) for v in base["runs"]]}
        agg["linearity"] = ratio_spread(agg["samples_per_s"], ideal) if agg["samples_per_s"]["n"] == base["n"] \
            else spread([agg["samples_per_s"]["median"] / ideal["median"]])
        out[str(n)] = agg
    return out


def print_table(agg: dict, args) -> None:
    print(f"EMULATED: the demo job (async) on N x {args.profile}, half rollout, half trainer; modelled seconds")
    hdr = (f"{'N':>3} {'samples/s':>22} {'s/step':>20} {'bound s/step':>20} {'sched. eff.':>20} "
           f"{'linearity':>20} {'trainer wait s':>18} {'rebalances':>12}")
    print_header(hdr)
    for n, r in agg.items():
        print(f"{n:>3} {fmt_spread(r['samples_per_s'], '.1f'):>22} {fmt_spread(r['s_per_step'], '.1f'):>20} "
              f"{fmt_spread(r['lower_bound_s_per_step'], '.1f'):>20} {fmt_spread(r['scheduling_efficiency']):>20} "
              f"{fmt_spread(r['linearity']):>20} {fmt_spread(r['trainer_wait_s_per_step'], '.1f'):>18} "
              f"{fmt_spread(r['task_group_rebalances'], '.0f'):>12}")


# -- the solver-verifier team at scale (--job solver_verifier) -------------------------
SV_CONFIG = ROOT / "examples" / "solver_verifier.yaml"
TABLE2 = ROOT / "benchmarks" / "results" / "multi_policy_emulated.json"


def sv_split(n: int, table2: dict) -> dict[str, dict[str, int]]:
    """Table 2's device split at 8 (the rule ``multi_policy --emulated`` printed and recorded:
    each pool and trainer priced on (c)'s own calls), scaled to ``n`` devices."""
    base = table2["device_split"]["split"]
    at = table2["devices"]
    if n % at:
        raise ValueError(f"{n} devices are not a multiple of Table 2's {at}")
    return {p: {st: d * n // at for st, d in parts.items()} for p, parts in base.items()}


def pool_fits(devices: int, per_node: int) -> bool:
    """Whether a pool of ``devices`` splits evenly over the fewest RaaS nodes of <= ``per_node``."""
    return devices % max(1, -(-devices // per_node)) == 0


def sv_balanced_split(n: int, per_node: int, base: tuple[dict, list[dict]], train_scaling: float) -> dict:
    """The split of ``n`` devices that minimises the largest priced stage, priced on the team's
    own run at Table 2's 8 devices (``base``: its layout and repetitions; each resource's
    whole-run modelled work per iteration, the mean over the repetitions), its batch grown
    with ``n`` as the runs grow it. A pool's work is its nodes' device-seconds dealt over its
    devices (the same work per device at every N); a trainer's is rescaled to ``d``-way data
    parallel with the profile's efficiency ``train_scaling`` per doubling, as Table 2's rule
    (:func:`~astraflow.benchmarks.multi_policy_emulated.choose_split`) does. Pools must split
    evenly over nodes of <= ``per_node``; a trainer keeps at least Table 2's smallest one.

    Scaled by N/8, Table 2's split (3 + 2 solver, 1 + 2 verifier) gives each trainer 2N/8
    devices, but a trainer of more devices gains less per device, so at 64 the solver's trainer
    is the bound; this rule moves devices to it."""
    lay8, reps = base
    need = min(pool["trainer_devices"] for pool in lay8["pools"].values())
    split8 = {p: {"rollout": pool["nodes"] * pool["devices_per_node"], "trainer": pool["trainer_devices"]}
              for p, pool in lay8["pools"].items()}
    best = split_from_runs(split8, reps, "work_by_resource", n, train_scaling, need,
                           fits=lambda d: pool_fits(d, per_node), grow=n / lay8["devices"])
    if best is None:
        raise ValueError(f"{n} devices cannot hold the team's pools and trainers of >= {need} devices each")
    return best


def sv_layout(n: int, per_node: int, table2: dict, balanced: dict | None = None) -> dict:
    """The team's pools and trainers at ``n`` devices; each pool on RaaS nodes of <= ``per_node``:
    Table 2's split scaled by N/8, or ``balanced`` (:func:`sv_balanced_split`'s answer)."""
    split = balanced["split"] if balanced else sv_split(n, table2)
    pools = {}
    for p, parts in split.items():
        nodes = max(1, -(-parts["rollout"] // per_node))
        if parts["rollout"] % nodes:
            raise ValueError(f"{p}'s {parts['rollout']} rollout devices do not split evenly over {nodes} nodes")
        pools[p] = {"nodes": nodes, "devices_per_node": parts["rollout"] // nodes, "trainer_devices": parts["trainer"]}
    groups = SEED_SHAPE["groups_per_batch"] * n // table2["devices"]
    lead = next(iter(split))  # the solver: its pool's polls open the episodes
    out = {"devices": n, "split": split, "pools": pools, "groups_per_batch": groups,
           "tasks_per_call": -(-groups // pools[lead]["nodes"]), "n_samples": SEED_SHAPE["n_samples"],
           "split_rule": "scaled"}
    if balanced:
        out.update(split_rule="balanced", priced_stage_s=balanced["priced_stage_s"],
                   priced_bound_s_per_iter=balanced["priced_bound_s_per_iter"])
    return out


def sv_config(args, lay: dict, job: str, table2: dict) -> dict:
    """Table 2's arm (a) (``multi_policy --emulated``'s own config builder, its recorded
    settings) on ``lay``'s devices, the batch grown with them, dilation raised with N."""
    t2 = types.SimpleNamespace(
        profile=table2["profile"], dilation=args.dilation * lay["devices"] / 8, token_scale=table2["token_scale"],
        prompt_token_scale=table2["prompt_token_scale"], workload=table2.get("workload") or "",
        max_new_tokens_modelled=table2["max_new_tokens_modelled"], max_staleness=table2["max_staleness"],
        steps=args.steps, eval_problems=50, polls_in_flight=table2["polls_in_flight"])
    base = yaml.safe_load(SV_CONFIG.read_text())
    data = split_config(base, t2, lay["split"], "async", job, args.run_root)
    data["dataflow"]["groups_per_batch"] = lay["groups_per_batch"]
    data.setdefault("kafka", {})["task_partitions"] = max(8, *(v["nodes"] for v in lay["pools"].values()))
    for p, pool in lay["pools"].items():
        r = data["policies"][p]["rollout"]
        r["nodes"] = pool["nodes"]
        r["device"]["count"] = pool["devices_per_node"]
        r["tasks_per_call"] = lay["tasks_per_call"]
    return data, t2.dilation


def sv_one(args, lay: dict, rep: int, table2: dict) -> dict:
    from astraflow.config import load_config  # the job machinery (~1 s to import): only when a count runs
    from astraflow.launcher import run_job
    job = f"bench-scale-sv-{lay['devices']}-{int(time.time())}-{rep}"
    data, dilation = sv_config(args, lay, job, table2)
    path = write_config(data, Path(args.run_root))
    run_dir = Path(args.run_root) / job
    print(f"--- solver-verifier, {lay['devices']} devices, repetition {rep + 1}: {lay['pools']} ({job})", flush=True)
    run_job(load_config(path), run_dir=run_dir, progress=False, timeout_s=args.run_timeout)
    return sv_analyse(run_dir, lay, args.steps, dilation, table2["max_staleness"])


def sv_analyse(run_dir: Path, lay: dict, steps: int, dilation: float, max_staleness: int) -> dict:
    """One team run at scale: s/iter, bound and scheduling efficiency of its steady window
    (:func:`~astraflow.benchmarks.lib.steady.steady_window`: from the end of step
    ``max_staleness + 2`` to the end of step ``steps``, the job training past it so work is in
    flight at both ends; the bound the busiest resource's work inside it). A short
    run's pools roll out up to ``max_staleness`` batches ahead before the window (4 polls in
    flight at once), so their whole-run work per batch (``work_by_resource``,
    :func:`resource_work`) says what a long run would need of them, not what limited this window."""
    r = analyse_team(run_dir)
    rows = read_rows(run_dir)
    summary = read_summary(run_dir)
    window = steady_window(rows, r["last_policy"], max_staleness, dilation, window_end=steps)
    trained = steps_for_window(steps, max_staleness)
    whole = resource_work(summary, episodes_worked(rows), lay["groups_per_batch"], trained)
    em = summary.get("emulated", {})
    return {**window, "samples_per_s": len(lay["split"]) * lay["groups_per_batch"] * lay["n_samples"]
            / window["s_per_iter"],
            "work_by_resource": whole, "busiest_whole_run": max(whole, key=whole.get),
            "fenced_episodes": episodes_fenced(rows), "task_group_rebalances": rebalances(rows),
            "episodes_per_trained_group": r["episodes"] / (trained * lay["groups_per_batch"]),
            "cpu_fraction": cpu_fractions(em), "overruns": overruns(em), "run_dir": str(run_dir),
            "wall_s": r["wall_s"]}


SV_KEYS = ("s_per_iter", "samples_per_s", "lower_bound_s_per_iter", "scheduling_efficiency", "fenced_episodes",
           "task_group_rebalances", "episodes_per_trained_group")


SV_SETTINGS = ("profile", "token_scale", "prompt_token_scale", "workload", "max_new_tokens_modelled", "max_staleness",
               "polls_in_flight")


def kept_counts(out: Path, args, table2: dict, counts: list[int]) -> dict[int, tuple[dict, list[dict]]]:
    """The solver-verifier section's earlier device counts that this run does not measure (with
    ``--add-repetitions``, also those it does), with their layouts and repetitions, when they were
    measured the same way (steps, dilation and Table 2's settings equal); a section measured
    otherwise is replaced, not mixed."""
    old = (json.loads(out.read_text()) if out.is_file() else {}).get("solver_verifier") or {}
    same = (old.get("steps") == args.steps and old.get("dilation_at_8") == args.dilation
            and old.get("window") == WINDOW_RULE
            and old.get("table2_settings") == {k: table2.get(k) for k in SV_SETTINGS})
    if not same:
        return {}
    return {int(n): (old["layouts"][n], reps) for n, reps in old.get("repetitions", {}).items()
            if (int(n) not in counts or getattr(args, "add_repetitions", False)) and n in old.get("layouts", {})}


def sv_main(args, counts: list[int]) -> int:
    table2 = json.loads(TABLE2.read_text())
    if args.steps < 2 * (table2["max_staleness"] + 2):
        print(f"note: {args.steps} steps; the steady window starts after step {table2['max_staleness'] + 2} (the "
              f"batches rolled out ahead at the start), so fewer than {2 * (table2['max_staleness'] + 2)} steps "
              "measure mostly the start's transient", flush=True)
    at = table2["devices"]
    lays = {n: sv_layout(n, args.devices_per_node, table2) for n in counts
            if args.split == "scaled" or n == at}
    load_before = load_now()
    rows: dict[int, list[dict]] = {n: [] for n in counts}
    kept = kept_counts(Path(args.out), args, table2, counts)
    for n, (lay, reps) in kept.items():  # device counts this run does not measure stay as measured
        lays[n], rows[n] = lay, list(reps)
    start = {n: len(rows[n]) for n in counts}  # --add-repetitions: the recorded ones come first
    if args.split == "balanced" and at not in counts and at not in kept:
        raise SystemExit(f"--split balanced prices the split on the team's own run at {at} devices: "
                         f"none is recorded in {args.out} with these settings; run --devices {at} first")
    rows = dict(sorted(rows.items()))
    for rep in range(args.repeats):
        for n in sorted(counts):
            if n not in lays:  # balanced: priced on the run at Table 2's devices (measured first)
                scaling = load_profile(table2["profile"]).efficiency.train_scaling
                bal = sv_balanced_split(n, args.devices_per_node, (lays[at], rows[at]), scaling)
                lays[n] = sv_layout(n, args.devices_per_node, table2, bal)
                print(f"    balanced split at {n}: {bal['split']} (priced bound "
                      f"{bal['priced_bound_s_per_iter']:.1f} s/iter)", flush=True)
            lays = dict(sorted(lays.items()))
            rows[n].append(sv_one(args, lays[n], start[n] + rep, table2))
            agg = aggregate({k: v for k, v in rows.items() if v}, SV_KEYS)
            write_section(Path(args.out), "solver_verifier", {
                "emulated": True, "job": "solver_verifier", "steps": args.steps, "window": WINDOW_RULE,
                "repeats_planned": args.repeats + max(start.values(), default=0),
                "dilation_at_8": args.dilation, "split_from": "each layout's split_rule: scaled = multi_policy_emulated.json's device_split "
                "scaled by N/8; balanced = sv_balanced_split, priced on this section's run at 8 devices",
                "table2_settings": {k: table2.get(k) for k in SV_SETTINGS},
                "layouts": {str(k): v for k, v in lays.items()}, "by_devices": agg,
                "repetitions": {str(k): v for k, v in rows.items()}}, load_before, "emulated_scale")
    agg = aggregate(rows, SV_KEYS)
    print("EMULATED: the solver-verifier team (Table 2's arm (a)) on N x h100-qwen3-8b; modelled seconds")
    for n, r in agg.items():
        print(f"{n:>3} samples/s {fmt_spread(r['samples_per_s'], '.1f')}  s/iter {fmt_spread(r['s_per_iter'], '.1f')}  "
              f"bound {fmt_spread(r['lower_bound_s_per_iter'], '.1f')}  eff {fmt_spread(r['scheduling_efficiency'])}  "
              f"linearity {fmt_spread(r['linearity'])}  rebalances {fmt_spread(r['task_group_rebalances'], '.0f')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument("--devices", default="8,16,32,64", help="device counts, comma-separated")
    ap.add_argument("--devices-per-node", type=int, default=8, help="emulated devices one RaaS node process holds")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", default="h100-qwen3-8b")
    ap.add_argument("--dilation", type=float, default=0.3, help="wall seconds per modelled second at 8 devices")
    ap.add_argument("--token-scale", type=int, default=512)
    ap.add_argument("--prompt-token-scale", type=int, default=16)
    ap.add_argument("--run-timeout", type=float, default=1200.0)
    ap.add_argument("--quick", action="store_true", help="8 and 16 devices, 4 steps, 1 repetition (a smoke run)")
    ap.add_argument("--job", choices=("demo", "solver_verifier"), default="demo",
                    help="demo: the single-policy demo job; solver_verifier: Table 2's team "
                         "(written to the JSON's solver_verifier section)")
    ap.add_argument("--split", choices=("balanced", "scaled"), default="balanced",
                    help="solver_verifier: the split at N devices; scaled = Table 2's split x N/8; balanced = "
                         "re-chosen at each N to minimise the largest stage, priced on the team's run at 8")
    ap.add_argument("--add-repetitions", action="store_true",
                    help="solver_verifier: keep the repetitions recorded at --devices (same settings and layout) "
                         "and add --repeats more")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--run-root", default=str(ROOT / "runs" / "bench-emulated-scale"))
    args = ap.parse_args(argv)
    if args.quick:
        args.devices, args.steps, args.repeats = "8,16", 4, 1
    counts = [int(x) for x in args.devices.split(",")]
    if args.job == "solver_verifier":
        return sv_main(args, counts)
    lays = {n: layout(n, args.devices_per_node) for n in counts}
    from astraflow.topics import EmbeddedBroker  # the Kafka client (~0.7 s to import): only when the demo job runs
    load_before = load_now()
    rows: dict[int, list[dict]] = {n: [] for n in counts}
    with EmbeddedBroker(heap="1g") as broker:
        for rep in range(args.repeats):  # interleaved, so a change in the machine's load hits every N
            for n in counts:
                rows[n].append(one(args, broker, lays[n], rep))
            save(args, lays, rows, rep + 1, load_before)  # what is measured so far survives a cut-off run
    print_table(aggregate(rows), args)
    return 0


def save(args, lays: dict, rows: dict, reps_done: int, load_before: dict) -> None:
    agg = aggregate(rows)
    out = Path(args.out)
    kept = {k: v for k, v in (json.loads(out.read_text()) if out.is_file() else {}).items() if k == "solver_verifier"}
    write_results(out, {**kept, 
        "benchmark": "emulated_scale", "emulated": True, "profile": args.profile, "steps": args.steps,
        "repeats": reps_done, "repeats_planned": args.repeats, "quick": args.quick, "dilation_at_8": args.dilation,
        "token_scale": args.token_scale, "prompt_token_scale": args.prompt_token_scale,
        "layouts": {str(n): lay for n, lay in lays.items()}, "method": __doc__, "by_devices": agg,
        "repetitions": {str(n): r for n, r in rows.items()}}, load_before)


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, heading, load_note, fmt_spread as _sp)


REPORT_TITLE = "Scale, EMULATED"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's sections of docs/benchmarks.md: the demo job and the solver–verifier team at N devices,
    from ``emulated_scale.json`` (none for a quick run)."""
    d = load("emulated_scale")
    if not d or d.get("quick"):
        return []
    out = [*heading(REPORT_TITLE),
           f"**Scale, EMULATED** — `python -m astraflow.benchmarks.emulated_scale` (the demo job, async, on N emulated "
           f"{d['profile']} devices: half rollout on RaaS nodes of up to 8, half training; the batch grows with N; "
           f"{d['steps']} steps; **modelled seconds**; median (min–max) of {d['repeats']} repetitions)", "",
           *_report_scale_rows(d["by_devices"], "step")]
    return out + [""] + _report_team_rows(d.get("solver_verifier"))


def _report_scale_rows(by_devices: dict, per: str) -> list[str]:
    """The table of a weak-scaling run: one row per device count, times per ``per`` (step, iter)."""
    out = [f"| devices (emulated) | samples/s | s/{per} | lower bound s/{per} | scheduling efficiency | linearity vs 8 |",
           "|---:|---:|---:|---:|---:|---:|"]
    for n, r in by_devices.items():
        out.append(f"| {n} | {_sp(r['samples_per_s'], '.1f')} | {_sp(r[f's_per_{per}'], '.1f')} | "
                   f"{_sp(r[f'lower_bound_s_per_{per}'], '.1f')} | {_sp(r['scheduling_efficiency'])} | "
                   f"{_sp(r['linearity'])} |")
    return out


def _report_team_rows(sv: dict | None) -> list[str]:
    """The solver-verifier team's rows of ``emulated_scale --job solver_verifier``."""
    if not sv or not sv.get("by_devices"):
        return []
    reps = ", ".join(f"{n}: {r['s_per_iter']['n']}" for n, r in sv["by_devices"].items())
    note = load_note(sv)
    out = [*heading("The solver–verifier team at scale, EMULATED"),
           f"**The solver–verifier team at scale, EMULATED** — `python -m astraflow.benchmarks.emulated_scale --job "
           f"solver_verifier` (Table 2's arm (a) at N devices, the batch grown with N; {sv['steps']} "
           f"iterations; **modelled seconds**; median (min–max) of each row's repetitions ({reps})"
           f"{note and note + ' (the last run)'})", "",
           *([] if sv.get("window") == WINDOW_RULE else [
               "**Measured before stop 66's fixes to the instrument, rerun pending** (the steady window ended where "
               "the pools ran dry; generated context priced at the prompt's scale: see Table 2's section).", ""]),
           *_report_scale_rows(sv["by_devices"], "iter")]
    splits = []
    for n, lay in sv.get("layouts", {}).items():
        parts = ", ".join(f"{p} {d['rollout']}+{d['trainer']}" for p, d in lay["split"].items())
        rule = lay.get("split_rule", "scaled")
        what = "Table 2 x N/8" if rule == "scaled" else "balanced at N"
        measured = sv["by_devices"].get(n, {}).get("lower_bound_s_per_iter", {}).get("median")
        if rule == "balanced" and "priced_bound_s_per_iter" in lay and measured is not None:
            what += f"; priced bound {lay['priced_bound_s_per_iter']:.1f} s/iter, measured {measured:.1f}"
        splits.append(f"{n}: {parts} ({what})")
    if splits:
        out += ["", "Devices (rollout + trainer per policy): " + "; ".join(splits) + ". Balanced: re-chosen at N to "
                "minimise the largest stage, priced on the 8-device run (`--split balanced`)."]
    return out + [""]


if __name__ == "__main__":
    raise SystemExit(main())
