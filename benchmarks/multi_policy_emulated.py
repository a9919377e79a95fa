"""Table 2 at the seed's scale on emulated accelerators (``multi_policy.py --emulated``).

The solver-verifier team of ``examples/solver_verifier.yaml`` in the seed's shape (256
samples per batch: 32 prompts x 8 samples; 4 PPO minibatches per step) on ``--devices``
emulated devices of ``--profile`` (default 8 x H100 with the Qwen3-8B shape). The tiny
model computes every token, log-prob and gradient; every engine call is held for the time
the profile's cost model gives for it (``emulation/cost.py``), ``--dilation`` wall seconds per
modelled second, each real token standing for ``--token-scale`` modelled ones. Every time
here is **modelled seconds** (wall / dilation), emulated, not a GPU measurement.

**Lengths.** Every policy's length cap is the seed's (4096 new tokens per policy, the
AstraFlow recipe for two Qwen3-8B policies): its real ``max_new_tokens`` is 4096 /
``--token-scale``. With ``--workload`` (default ``reasoning``, ``emulation/profiles.yaml``)
each row's modelled length is spread around ``token_scale`` x its real length by a
log-normal factor of mean 1 keyed by the row's sampling seed (the same sample gets the same
length in every arm), capped at 4096: the long tail a reasoning model's answers have and the
tiny model's lack. ``--workload ''`` prices the tiny model's lengths, scaled.

Arms, per repetition, same config, seeds and prompts:

* **(c) trainer-centred**: ``sequential_multi.py`` (one controller, no broker) with every
  policy's engine and trainer on all the devices: generate every role for the batch (each
  role's calls of the batch coalesced, its rows dealt over the devices), then train each
  policy in turn on all the devices, swapping the other policy's states to host memory and
  back (``CostModel.swap_s``) and loading the new weights into the engines (verl's pipeline);
* **(a) ours**: ``run_job`` with disjoint devices per pool and trainer, ``barrier: async``;
* **(b) lockstep**: the same devices, ``barrier: lockstep``.

**Device split of (a)/(b)** (printed): from the first (c) run, each policy's modelled
generation seconds ``G_p`` and training seconds ``T_p`` per iteration on all ``N`` devices;
a pool of ``d`` devices is priced by the cost model on (c)'s own calls dealt over ``d``
devices, and a trainer of ``d`` devices ``T_p x N s(N) / (d s(d))`` (``s``: the profile's
data-parallel scaling); the split of ``N`` into the four parts that minimises the largest
priced stage is taken. A pool's node takes a batch's tasks (32) per poll, with up to ``--polls-in-flight`` polls
at once (the next batch's first calls run while the last one's episodes wait on the other
pool), and its engine batches every call in flight over its devices, as (c) deals a
batch's rows over all of them: fewer devices decode more rows each, at the
batch size a memory-bound decode step prices (``emulation/cost.py``).

**Steady state** (12 iterations per arm by default). (a), (b): s per iteration over the
last policy's trainer steps from the end of step ``max_staleness + 2`` to the last
(:func:`steady_window`): before it the pools roll out up to ``max_staleness`` batches ahead
and the first steps train those, so a window that took them in would credit the schedule
with work done before it (the 5-iteration runs of stops 40-41 did). (c): the mean of
iterations 3.. (every iteration of it alike). All / dilation.
**Lower bound** per arm: the busiest resource's modelled work per iteration. (c): all its
devices are one resource, so the sum of every call's modelled seconds per iteration. (a),
(b): per pool and trainer, its modelled seconds inside the steady window per iteration
(:func:`window_work`); the largest. Each resource's whole-run work per batch is kept beside
it (``work_by_resource``: pools over the episodes they rolled out, trainers per step).
**Scheduling efficiency** = bound / measured s per iteration (1.0: the busiest resource
never waits).

Prints one table; writes ``benchmarks/results/multi_policy_emulated.json``.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from astraflow.benchmarks.results_io import fmt_spread, load_now, ratio_spread, spread, write_results, write_section

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "multi_policy_emulated.json"
#: the seed's shape: 256 samples per batch, 8 per prompt, 4 PPO minibatches
SEED_SHAPE = {"groups_per_batch": 32, "n_samples": 8, "minibatches": 4}
#: the seed's length cap per policy ("Max new tokens 4096 (per policy)", the AstraFlow docs'
#: Qwen3-8B actor + verifier recipe): each policy's real max_new_tokens is this / token_scale
SEED_MAX_NEW_TOKENS = 4096
STAGES = ("rollout", "trainer")


# -- configs ---------------------------------------------------------------------------
def device(args, count: int) -> dict:
    return {"kind": "emulated", "profile": args.profile, "count": count, "dilation": args.dilation,
            "token_scale": args.token_scale, "prompt_token_scale": args.prompt_token_scale,
            **({"workload": args.workload} if args.workload else {})}


def real_max_new_tokens(args) -> int:
    """Each policy's real cap: the seed's modelled cap in real tokens."""
    if args.token_scale > args.max_new_tokens_modelled:
        raise ValueError(f"--token-scale {args.token_scale} is above the modelled cap {args.max_new_tokens_modelled}")
    return args.max_new_tokens_modelled // args.token_scale


def shaped(base: dict, args) -> dict:
    """``base`` in the seed's shape, evaluated only at the start and the end, on few problems
    (the evaluator runs on the CPU: accuracy is not what this benchmark measures)."""
    data = copy.deepcopy(base)
    data.setdefault("dataflow", {})["groups_per_batch"] = SEED_SHAPE["groups_per_batch"]
    data.setdefault("rollout", {})["n_samples"] = SEED_SHAPE["n_samples"]
    data.setdefault("trainer", {}).setdefault("engine", {})["minibatches"] = SEED_SHAPE["minibatches"]
    data["trainer"]["steps"] = args.steps
    if args.max_staleness is not None:
        data.setdefault("dataflow", {})["max_staleness"] = args.max_staleness
    # every policy's length cap is the seed's, in real tokens (the emulated model's cap is token_scale x it)
    cap = real_max_new_tokens(args)
    data["rollout"]["max_new_tokens"] = cap
    for sec in (data.get("policies") or {}).values():
        if isinstance(sec, dict) and "max_new_tokens" in (sec.get("rollout") or {}):
            sec["rollout"]["max_new_tokens"] = cap
    data["eval"] = {**data.get("eval", {}), "every": 0, "problems": args.eval_problems, "k": 1}
    return data


def colocated_config(base: dict, args) -> dict:
    """(c): every policy's engine and trainer on all ``args.devices``."""
    data = shaped(base, args)
    data["rollout"]["device"] = device(args, args.devices)
    data["trainer"]["device"] = device(args, args.devices)
    return data


def split_config(base: dict, args, split: dict[str, dict[str, int]], barrier: str, job: str, run_dir: str) -> dict:
    """(a) / (b): each policy's pool and trainer on their own devices (``split[policy][stage]``)."""
    data = shaped(base, args)
    data.update(job=job, barrier=barrier, run_dir=run_dir)
    for p, parts in split.items():
        sec = data.setdefault("policies", {}).setdefault(p, {})
        # a shared policy's pool and trainer name the same devices and take turns on them
        share = {"share": p} if "shared" in parts else {}
        sec.setdefault("rollout", {}).update(device={**device(args, devices_of_stage(parts, "rollout")), **share},
                                             nodes=1, tasks_per_call=SEED_SHAPE["groups_per_batch"],
                                             polls_in_flight=args.polls_in_flight)
        sec.setdefault("trainer", {})["device"] = {**device(args, devices_of_stage(parts, "trainer")), **share}
    return data


def devices_of_stage(parts: dict[str, int], stage: str) -> int:
    """A policy's devices for ``stage`` in a split: its own, or those its pool and trainer share."""
    return parts["shared"] if "shared" in parts else parts[stage]


def placement(parts: dict[str, int]) -> str:
    """A policy's place in a split, in words."""
    if "shared" in parts:
        return f"pool and trainer taking turns on {parts['shared']}"
    return f"pool {parts['rollout']} + trainer {parts['trainer']}"


# -- the device split -------------------------------------------------------------------
def work_by_policy(emulated: dict, steps: int) -> dict[str, dict[str, float]]:
    """(c)'s modelled seconds per iteration, per policy: generation (its engine's calls and
    weight loads) and training (its trainer's steps)."""
    out: dict[str, dict[str, float]] = {}
    for comp, d in emulated.items():
        kind, policy = comp.split(".", 1)
        # a disjoint trainer swaps nothing: (c)'s swaps are not (a)'s work
        per = lambda c: d.get(c, {}).get("modelled_s", 0.0) / steps  # noqa: E731
        if kind == "raas":
            out.setdefault(policy, {}).update(rollout=per("generate") + per("weight_load"),
                                              weight_load=per("weight_load"))
        else:
            out.setdefault(policy, {})["trainer"] = per("train")
    return out


def min_max_split(keys: list[tuple[str, str]], devices: int, price, allowed) -> dict | None:
    """Of every way to deal ``devices`` over the stages ``keys`` ((policy, "rollout" |
    "trainer"), each at least one device, ``allowed(key, d)``), the one whose largest
    ``price(key, d)`` is smallest: ``{"split": {policy: {stage: d}}, "priced_stage_s",
    "priced_bound_s_per_iter"}``, or None when no way is allowed. The search of every split
    rule here (Table 2's, the re-priced one, the team at scale's)."""
    best = None
    for cut in itertools.combinations(range(1, devices), len(keys) - 1):
        parts = [b - a for a, b in zip((0, *cut), (*cut, devices))]
        if not all(allowed(key, d) for key, d in zip(keys, parts)):
            continue
        stages = {f"{p}.{st}": price((p, st), d) for (p, st), d in zip(keys, parts)}
        if best is None or max(stages.values()) < best[0]:
            best = (max(stages.values()), parts, stages)
    if best is None:
        return None
    split: dict[str, dict[str, int]] = {}
    for (p, st), d in zip(keys, best[1]):
        split.setdefault(p, {})[st] = d
    return {"split": split, "priced_stage_s": best[2], "priced_bound_s_per_iter": best[0]}


#: a shared placement is taken only when priced this much below the best disjoint one: the
#: turn-taking's waits (a pool's calls, and the other policy's episodes that need them, stand
#: still for a step) are not in the price
SHARE_MARGIN = 0.05


def best_placement(policies: list[str], devices: int, price, allowed, shareable: bool) -> dict | None:
    """:func:`min_max_split` over each placement of the ``policies``: every pool and trainer on
    devices of its own, or (``shareable``) some policies' pool and trainer taking turns on the
    same devices (stage ``"shared"``, ``price((p, "shared"), d)``, ``device.share``). A shared
    placement is taken when its priced bound is ``SHARE_MARGIN`` below the best disjoint one's;
    the answer keeps that one as ``disjoint``."""
    best, disjoint = None, None
    for k in range(len(policies) + 1 if shareable else 1):
        for shared in itertools.combinations(policies, k):
            keys = [(p, st) for p in policies for st in (("shared",) if p in shared else STAGES)]
            got = min_max_split(keys, devices, price, allowed)
            if got is None:
                continue
            if not shared:
                disjoint = best = got
            elif best is None or got["priced_bound_s_per_iter"] < best["priced_bound_s_per_iter"] * (
                    1 - SHARE_MARGIN if best is disjoint else 1):
                best = got
    if best is None:
        return None
    return {**best, **({"disjoint": disjoint} if disjoint is not None and best is not disjoint else {})}


def stage_of(comp: str) -> tuple[str, str]:
    """A Kafka arm's emulated resource as (policy, stage): ``raas-<policy>-<i>`` -> (policy,
    "rollout"), ``trainer.<policy>`` -> (policy, "trainer"), ``shared.<policy>`` (a pool and
    trainer taking turns, :func:`merge_shared`) -> (policy, "shared")."""
    if comp.startswith(("trainer.", "shared.")):
        kind, policy = comp.split(".", 1)
        return policy, kind
    return comp.split("-", 1)[1].rsplit("-", 1)[0], "rollout"


def merge_shared(work: dict[str, float], shared: set[str]) -> dict[str, float]:
    """Per resource work with each shared policy's pool and trainer as one resource,
    ``shared.<policy>`` (their devices are the same: their work adds up)."""
    out: dict[str, float] = {}
    for comp, v in work.items():
        p, _ = stage_of(comp)
        key = f"shared.{p}" if p in shared else comp
        out[key] = out.get(key, 0.0) + v
    return out


def split_from_runs(split: dict[str, dict[str, int]], reps: list[dict], key: str, devices: int,
                    train_scaling: float, need: int, fits=lambda d: True, grow: float = 1.0,
                    swap=None) -> dict | None:
    """The split of ``devices`` priced on the team's own runs on ``split`` (``reps``: each one's
    modelled work per iteration by resource under ``key``, the mean over them), the batch
    ``grow`` times theirs. A pool's work is its nodes' busy seconds times the devices each
    holds, dealt over ``d`` devices (the same work per device at any size: conservative, as a
    pool of fewer devices decodes more rows per step); a trainer's is rescaled to ``d``-way data
    parallel with the profile's efficiency ``train_scaling`` per doubling, as :func:`choose_split`
    does. Trainers keep >= ``need`` devices; a pool's ``d`` must pass ``fits``. With ``swap``
    (the swap's price on ``d`` devices, ``CostModel.swap_s``) a policy's pool and trainer may
    also take turns on the same ``d`` devices, priced as the sum of both plus a swap per
    iteration (:func:`best_placement`); a shared policy of the runs had its swaps in its
    trainer's work, taken out before pricing."""
    s = lambda d: train_scaling ** math.log2(d)  # noqa: E731
    mean = lambda k: sum(r[key].get(k, 0.0) for r in reps) / len(reps)  # noqa: E731
    device_s: dict[tuple[str, str], float] = {}
    for p, parts in split.items():
        nodes = [k for k in reps[0][key] if stage_of(k) == (p, "rollout")]
        pool_d, train_d = devices_of_stage(parts, "rollout"), devices_of_stage(parts, "trainer")
        swapped = swap(train_d) if swap is not None and "shared" in parts else 0.0
        device_s[p, "rollout"] = sum(mean(k) for k in nodes) * pool_d / max(1, len(nodes)) * grow
        device_s[p, "trainer"] = (mean(f"trainer.{p}") - swapped) * train_d * s(train_d) * grow

    def price(k: tuple[str, str], d: int) -> float:
        p, st = k
        if st == "shared":
            return price((p, "rollout"), d) + price((p, "trainer"), d) + swap(d)
        return device_s[k] / (d if st == "rollout" else d * s(d))

    return best_placement(sorted(split), devices, price,
                          lambda k, d: d >= need if k[1] != "rollout" else fits(d), swap is not None)


def choose_split(work: dict[str, dict[str, float]], rows: dict[str, list], devices: int, cost,
                 steps: int) -> dict:
    """The split of ``devices`` over every policy's pool and trainer that minimises the largest
    priced stage (see the module's method); every candidate's price is kept for the record.

    A pool of ``d`` devices is priced by the cost model on (c)'s own calls (``rows``: each
    call's real row lengths), each call dealt over ``d`` devices (a pool's node takes a
    batch's tasks per call), plus its weight loads; a trainer of ``d`` devices by (c)'s
    training seconds rescaled to ``d``-way data parallel."""
    from astraflow.emulation.engines import dealt_s

    scaling = cost.profile.efficiency.train_scaling
    s = lambda d: scaling ** math.log2(d)  # noqa: E731
    cache: dict[tuple[str, str, int], float] = {}

    def price(key: tuple[str, str], d: int) -> float:
        p, st = key
        if st == "shared":  # taking turns on the same devices: both, and a swap per iteration
            return price((p, "rollout"), d) + price((p, "trainer"), d) + cost.swap_s(d)
        if (p, st, d) not in cache:
            if st == "rollout":
                cache[p, st, d] = (sum(dealt_s(cost, call, d) for call in rows[p]) / steps
                                   + work[p]["weight_load"])
            else:
                cache[p, st, d] = work[p]["trainer"] * devices * s(devices) / (d * s(d))
        return cache[p, st, d]

    need = cost.min_train_devices()  # a trainer's states must fit its devices' memory
    best = best_placement(sorted(work), devices, price, lambda key, d: key[1] == "rollout" or d >= need, True)
    if best is None:
        raise ValueError(f"{devices} devices cannot hold {len(work)} pools and trainers of >= {need} devices each")
    return {**best, "min_train_devices": need, "rule": SPLIT_RULE}


SPLIT_RULE = ("minimise the largest priced stage: a pool of d devices = the cost model on (c)'s calls dealt over d "
              "devices, a trainer of d >= min_train_devices devices = (c)'s training time * N*s(N)/(d*s(d)); a "
              f"policy's pool and trainer taking turns on d devices = both + a swap, taken when "
              f"{SHARE_MARGIN:.0%} below the best disjoint split")


# -- the arms ---------------------------------------------------------------------------
def run_colocated(base: dict, args, rep: int) -> dict:
    """(c) as its own Python process on its config file; modelled seconds."""
    with tempfile.TemporaryDirectory() as d:
        cfg_path = Path(d) / "colocated.yaml"
        data = colocated_config(base, args)
        data["job"] = f"bench-mpe-colocated-{rep}"
        cfg_path.write_text(yaml.safe_dump(data, sort_keys=False))
        out = Path(d) / "sequential.json"
        cmd = [sys.executable, "-m", "astraflow.benchmarks.sequential_multi", "--config", str(cfg_path),
               "--steps", str(args.steps), "--threads", "1", "--no-eval", "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"(c) failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        r = json.loads(out.read_text())
    emulated, steps = r["emulated"], args.steps
    rows = {comp.split(".", 1)[1]: d.pop("rows") for comp, d in emulated.items() if "rows" in d}
    total = sum(modelled_s(d) for d in emulated.values())
    steady = r["per_iteration"][2:] or r["per_iteration"]
    return {"s_per_iter": r["s_per_iter"] / args.dilation,
            "lower_bound_s_per_iter": total / steps,
            "phases_s_per_iter": {k: r[k] / args.dilation for k in r if k.startswith(("G_", "T_", "W_"))
                                  and k.endswith("_s")},
            "work_by_policy": work_by_policy(emulated, steps), "cpu_fraction": cpu_fractions(emulated),
            "overruns": overruns(emulated),
            "generate_calls_per_iteration": {comp: d.get("generate", {}).get("calls", 0) / steps
                                             for comp, d in emulated.items() if "generate" in d},
            "iterations": len(r["per_iteration"]), "steady_iterations": len(steady), "emulated": emulated,
            "_rows": rows}


def modelled_s(component: dict) -> float:
    """One component's modelled seconds over all its kinds of call (an ``emulated`` summary entry)."""
    return sum(c.get("modelled_s", 0.0) for c in component.values() if isinstance(c, dict))


def cpu_fractions(emulated: dict) -> dict[str, float]:
    """Per component, the real work's CPU seconds over its held seconds (all calls)."""
    out = {}
    for comp, d in emulated.items():
        calls = [c for c in d.values() if isinstance(c, dict)]
        held = sum(c.get("held_s", 0.0) for c in calls)
        cpu = sum(c.get("cpu_fraction", 0.0) * c.get("held_s", 0.0) for c in calls)
        out[comp] = round(cpu / held, 4) if held else 0.0
    return out


def overruns(emulated: dict) -> int:
    """Calls whose real work outlasted their hold (the instrument measured the CPU there)."""
    return int(sum(c.get("overruns", 0) for d in emulated.values() for c in d.values() if isinstance(c, dict)))


def _last_per_node(rows: list[dict], name: str) -> float:
    """The sum over nodes of each node's last (largest) value of running count ``name``."""
    last: dict[str, float] = {}
    for r in rows:
        if r["name"] == name:
            node = r.get("label.node", "")
            last[node] = max(last.get(node, 0.0), float(r["value"]))
    return sum(last.values())


def episodes_fenced(rows: list[dict]) -> float:
    """Episodes rolled out in polls that were fenced (dropped at their commit after a rebalance):
    ``raas.fenced_tasks`` is each node's running count, so its last value per node."""
    return _last_per_node(rows, "raas.fenced_tasks")


def episodes_worked(rows: list[dict]) -> float:
    """Every episode a pool's devices worked on: those committed (``raas.tasks``), those of
    fenced polls (redone elsewhere) and those of polls still rolling out when the run's record
    ends (``raas.tasks_in_flight``, each node's last report, sent with its device totals; with
    several polls in flight that tail is up to ``polls_in_flight`` polls). Pricing a pool's
    work per batch over fewer episodes than its devices worked on would make the "lower bound"
    exceed the time measured. Counting a barely begun episode as a whole one errs the other
    way: the bound stays a bound."""
    committed = sum(float(r["value"]) for r in rows if r["name"] == "raas.tasks")
    in_flight: dict[str, tuple[float, float]] = {}  # node -> (ts, value) of its last report: a gauge
    for r in rows:
        if r["name"] == "raas.tasks_in_flight":
            node, ts = r.get("label.node", ""), float(r.get("ts", 0.0))
            if node not in in_flight or ts >= in_flight[node][0]:
                in_flight[node] = (ts, float(r["value"]))
    return committed + episodes_fenced(rows) + sum(v for _, v in in_flight.values())


def window_work(rows: list[dict], t0: float, t1: float, iterations: int, slack_s: float = 0.5) -> dict[str, float]:
    """Per emulated component, its modelled seconds of work between wall times ``t0`` and ``t1``
    per iteration: the change of its cumulative ``emulated.<call>.modelled_s`` reports (a
    trainer's at each step's end, a node's at each heartbeat; ``slack_s`` takes in a report
    sent just after the instant it belongs to). Over a steady window this is the work each
    resource did per iteration there, whatever it rolled out ahead before the window; the
    busiest one's is the window's lower bound, and bound / measured its utilisation."""
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in rows:
        name = r["name"]
        if name.startswith("emulated.") and name.endswith(".modelled_s"):
            series.setdefault((r["component"], name), []).append((float(r["ts"]), float(r["value"])))

    def at(points: list[tuple[float, float]], t: float) -> float:
        return max((v for ts, v in points if ts <= t + slack_s), default=0.0)  # cumulative: never falls

    out: dict[str, float] = {}
    for (comp, _), points in series.items():
        out[comp] = out.get(comp, 0.0) + (at(points, t1) - at(points, t0)) / iterations
    return out


def steady_window(rows: list[dict], policy: str, max_staleness: int, dilation: float,
                  shared: set[str] = frozenset()) -> dict:
    """A Kafka arm's steady state, from its metrics ``rows``: seconds per iteration over
    ``policy``'s trainer steps from the end of step ``max_staleness + 2`` to the last (modelled:
    wall / ``dilation``), and the bound of that window, the busiest resource's modelled work
    per iteration **inside it** (:func:`window_work`), so bound / measured is that resource's
    utilisation there. Before the window the pools roll out up to ``max_staleness`` batches
    ahead of the trainers (several polls in flight at once) and the first steps train those:
    a window that took them in would credit the schedule with work done before it. With too few
    steps the window is the last step alone. A ``shared`` policy's pool and trainer take turns on
    the same devices: one resource for the bound, their work added (:func:`merge_shared`;
    ``work_in_window_by_resource`` keeps each component's)."""
    from astraflow.benchmarks.multi_policy import trainer_steps
    ts = trainer_steps(rows)[policy]
    last = max(ts)
    if last < 3:
        raise ValueError(f"{last} trained steps of {policy}; a steady window needs at least 3")
    first = min(max(2, max_staleness + 2), last - 1)
    iters = last - first
    in_window = window_work(rows, ts[first], ts[last], iters)
    resources = merge_shared(in_window, set(shared))
    per_iter = (ts[last] - ts[first]) / iters / dilation
    bound = max(resources.values())
    return {"s_per_iter": per_iter, "lower_bound_s_per_iter": bound, "scheduling_efficiency": bound / per_iter,
            "busiest": max(resources, key=resources.get), "work_in_window_by_resource": in_window,
            **({"shared_resources": {k: v for k, v in resources.items() if k.startswith("shared.")}} if shared else {}),
            "window_steps": [first, last]}


def resource_work(summary: dict, episodes: float, groups_per_batch: int, steps: int) -> dict[str, float]:
    """Per pool and trainer of a Kafka arm, its modelled seconds per iteration: pools' over the
    episodes they rolled out scaled to a batch, trainers' per step."""
    out = {}
    for comp, d in summary.get("emulated", {}).items():
        total = modelled_s(d)
        if comp.startswith("trainer"):
            out[comp] = total / steps
        elif episodes:
            out[comp] = total * groups_per_batch / episodes
    return out


def run_split(base: dict, args, split: dict, barrier: str, rep: int) -> dict:
    from astraflow.benchmarks.multi_policy import analyse_team, run_attempts, write_config
    from astraflow.config import load_config
    from astraflow.launcher import run_job

    shared = {p for p, parts in split.items() if "shared" in parts}  # pools and trainers taking turns

    def once(job: str) -> dict:
        path = write_config(split_config(base, args, split, barrier, job, str(args.run_root)), Path(args.run_root))
        run_dir = Path(args.run_root) / job
        cfg = load_config(path)
        run_job(cfg, run_dir=run_dir, progress=False, timeout_s=args.run_timeout)
        r = analyse_team(run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        fenced = episodes_fenced(rows)
        work = resource_work(summary, episodes_worked(rows), SEED_SHAPE["groups_per_batch"], args.steps)
        whole = merge_shared(work, shared)
        em = summary.get("emulated", {})
        batches = r["episodes"] / SEED_SHAPE["groups_per_batch"]
        calls = {comp: d.get("generate", {}).get("calls", 0) / batches for comp, d in em.items()
                 if "generate" in d and batches}
        return {**steady_window(rows, r["last_policy"], args.max_staleness, args.dilation, shared),
                "generate_calls_per_iteration": calls, "fenced_episodes": fenced,
                # what a long run needs of each resource: its whole-run work per batch (a short run's
                # pools also did, before the window, the batches the first steps train)
                "work_by_resource": work, "busiest_whole_run": max(whole, key=whole.get),
                "cpu_fraction": cpu_fractions(summary.get("emulated", {})),
                "overruns": overruns(summary.get("emulated", {})),
                "episodes_per_trained_group": r["episodes"] / (args.steps * SEED_SHAPE["groups_per_batch"]),
                "by_policy": r["by_policy"], "run_dir": str(run_dir), "wall_s": r["wall_s"],
                # a role served by the other pool: median / p95 seconds per call (modelled) and hops per episode
                "remote_calls": {k: (v / args.dilation if k.endswith("_s") else v)
                                 for k, v in r["remote_calls"].items()}}
    return run_attempts(f"emulated-{barrier}", rep, once)


# -- results ----------------------------------------------------------------------------
ARMS = {"async": "(a) ours, async", "lockstep": "(b) lockstep", "colocated": "(c) trainer-centred"}


def spread_each(per: list[dict], key: str) -> dict:
    """Each entry of the repetitions' ``key`` dicts as a spread over them (0 where one lacks it)."""
    return {k: spread([x[key].get(k, 0.0) for x in per]) for k in per[0][key]}


def aggregate(reps: list[dict]) -> dict:
    arms = {}
    for arm in ARMS:
        per = [r[arm] for r in reps]
        arms[arm] = {"s_per_iter": spread([x["s_per_iter"] for x in per]),
                     "lower_bound_s_per_iter": spread([x["lower_bound_s_per_iter"] for x in per]),
                     "scheduling_efficiency": spread([x["lower_bound_s_per_iter"] / x["s_per_iter"] for x in per]),
                     "max_cpu_fraction": spread([max(x["cpu_fraction"].values()) for x in per]),
                     "overruns": spread([x["overruns"] for x in per])}
        if all(x.get("remote_calls", {}).get("calls") for x in per):  # the Kafka arms
            arms[arm]["remote_calls"] = {k: spread([x["remote_calls"][k] for x in per])
                                         for k in ("median_s", "p95_s", "hops_per_episode")}
        if "work_in_window_by_resource" in per[0]:  # the Kafka arms' steady windows
            arms[arm]["busiest"] = [x["busiest"] for x in per]
            arms[arm]["window_steps"] = per[0]["window_steps"]
            arms[arm]["work_in_window_by_resource"] = spread_each(per, "work_in_window_by_resource")
        arms[arm]["generate_calls_per_iteration"] = (spread_each(per, "generate_calls_per_iteration")
                                                     if "generate_calls_per_iteration" in per[0] else {})
    a, b, c = (arms[k]["s_per_iter"] for k in ("async", "lockstep", "colocated"))
    for arm, s in (("async", a), ("lockstep", b)):
        arms[arm]["speedup_vs_sequential"] = ratio_spread(c, s)
    arms["async"]["speedup_vs_lockstep"] = ratio_spread(b, a)
    return {"arms": arms, "speedup_vs_sequential": arms["async"]["speedup_vs_sequential"],
            "speedup_vs_lockstep": arms["async"]["speedup_vs_lockstep"]}


def print_table(agg: dict, split: dict, args) -> None:
    print(f"EMULATED: {args.devices} x {args.profile} (modelled seconds; dilation {args.dilation}, "
          f"token_scale {args.token_scale}, cap {args.max_new_tokens_modelled} tokens, "
          f"workload {args.workload or 'none'}); split of (a)/(b): "
          + ", ".join(f"{p} pool {d['rollout']} + trainer {d['trainer']}" for p, d in split["split"].items()))
    hdr = f"{'arm':24} {'s/iter':>22} {'lower bound s/iter':>22} {'sched. efficiency':>20} {'vs (c)':>18}"
    print(hdr)
    print("-" * len(hdr))
    for arm, label in ARMS.items():
        r = agg["arms"][arm]
        vs = fmt_spread(r["speedup_vs_sequential"]) if "speedup_vs_sequential" in r else "1"
        print(f"{label:24} {fmt_spread(r['s_per_iter'], '.1f'):>22} {fmt_spread(r['lower_bound_s_per_iter'], '.1f'):>22} "
              f"{fmt_spread(r['scheduling_efficiency']):>20} {vs:>18}")
    print(f"(a) vs (b): {fmt_spread(agg['speedup_vs_lockstep'])}")


def notes(agg: dict, split: dict, args) -> list[str]:
    arms = agg["arms"]
    a, b, c = (arms[k]["s_per_iter"]["median"] for k in ("async", "lockstep", "colocated"))
    sp = agg["speedup_vs_sequential"]["median"]
    out = [f"Emulated, not measured on GPUs: {args.devices} x {args.profile}, times from the cost model "
           f"(emulation/profiles.yaml); the tiny model does the real work, so the plumbing (Kafka, dataflow, "
           f"weight transfer) is real and counted, in modelled seconds (its wall time / {args.dilation})."]
    out.append(f"(a) {a:.1f} s/iter, (b) {b:.1f}, (c) {c:.1f}: the speed-up of (a) over (c) is {sp:.2f}x "
               + ("(the seed's 2.7x reached)." if sp >= 2.7 else
                  f"(the seed reports 2.7x; not reached here, see below)."))
    if args.workload:
        out.append(f"Lengths: every policy's cap is the seed's {args.max_new_tokens_modelled} tokens and each row's "
                   f"modelled length is spread by the '{args.workload}' workload (emulation/profiles.yaml, an "
                   f"estimate with its source), the same sample getting the same length in every arm: (c)'s "
                   f"generation phases (solve, verify, retry) each wait for their longest row at the batch it "
                   f"leaves, while (a)'s pools keep admitting the next episodes' rows into the room it frees.")
    rc = arms["async"].get("remote_calls")
    out.append(f"In flight: (a)/(b) nodes keep {args.polls_in_flight} polls in flight under max_staleness "
               f"{args.max_staleness}: an episode crosses both pools (answer, verdict, retry)"
               + (f", a verdict call taking {rc['median_s']['median']:.0f} s median / {rc['p95_s']['median']:.0f} s "
                  f"p95 (modelled)" if rc else "")
               + ", so a pool stays busy only with about (an episode's latency / s per iteration) batches in "
                 "flight, and the staleness bound caps that depth (one batch per version).")
    lb_c = arms["colocated"]["lower_bound_s_per_iter"]["median"]
    lb_a = arms["async"]["lower_bound_s_per_iter"]["median"]
    priced = split["priced_bound_s_per_iter"]
    calls_a = agg["arms"]["async"].get("generate_calls_per_iteration", {})
    calls = (", ".join(f"{k} {v['median']:.1f}" for k, v in calls_a.items()) + " generate calls per iteration "
             "against (c)'s " + ", ".join(f"{k} {v['median']:.1f}" for k, v in
                                          agg["arms"]["colocated"].get("generate_calls_per_iteration", {}).items()))
    busiest = arms["async"].get("busiest") or []
    top = max(set(busiest), key=busiest.count) if busiest else ""
    win = arms["async"].get("work_in_window_by_resource") or {}

    def devices_of(comp: str) -> float:  # a pool's devices dealt over its nodes
        p, st = stage_of(comp)
        nodes = sum(1 for k in win if stage_of(k) == (p, st))
        return devices_of_stage(split["split"][p], st) / nodes

    if top.startswith("trainer."):
        p = stage_of(top)[0]

        def priced_pool(k: str) -> float:  # a pool taking turns with its trainer was priced with it
            q = stage_of(k)[0]
            return split["priced_stage_s"].get(f"{q}.rollout", split["priced_stage_s"].get(f"{q}.shared", 0.0))
        pools = ", ".join(f"{k} {v['median']:.1f} s (priced {priced_pool(k):.1f})"
                          for k, v in sorted(win.items()) if stage_of(k)[1] == "rollout")
        why = (f"{'more' if lb_a > priced else 'less'}; in its steady window the busiest resource was {top} in "
               f"{busiest.count(top)} of {len(busiest)} repetitions, the trainer the rule gave {split['split'][p]['trainer']} "
               f"devices, which it priced from (c)'s training rescaled to them at "
               f"{split['priced_stage_s'][f'{p}.trainer']:.1f} s/iter; the pools worked {pools} — with several polls "
               f"in flight a pool's devices decode more rows per step than (c)'s calls dealt over them")
    elif lb_a > priced:
        why = ("more: calls that arrive fragmented by the episodes (answers, remote verdicts, retries) after a batch "
               "has started decoding pay steps of their own, and a pool of fewer devices holds more rows each")
    else:
        why = ("less: with several polls in flight a pool's devices decode more rows per step than (c)'s calls dealt "
               "over them, and no call's longest row holds its device idle (the next rows take its room)")
    out.append(f"Priced before running, with (c)'s own calls (a batch's rows per call, each run to its end), the "
               f"split's busiest stage is {priced:.1f} s/iter ({lb_c / priced:.2f}x below (c)'s bound); (a)'s busiest "
               f"resource did {lb_a / priced:.2f}x that work, {why}"
               + (f" ({calls})" if calls_a else "") + ".")
    if win:
        dev_s = sum(v["median"] * devices_of(k) for k, v in win.items())
        even = dev_s / args.devices
        out.append(f"Granularity: (a)'s work per iteration in its window is {dev_s:.0f} device-seconds (medians: "
                   + ", ".join(f"{k} {v['median']:.1f} s x {devices_of(k):g}" for k, v in sorted(win.items()))
                   + f"); dealt evenly over the {args.devices} devices that is {even:.1f} s/iter, {c / even:.2f}x of (c), "
                   f"but a split is in whole devices and a trainer needs >= {split.get('min_train_devices', 1)}, so "
                   f"the busiest stage of the best split is far above that mean.")
    out.append(f"Bounds: (c) cannot go below {lb_c:.1f} s/iter (all its work in series on the devices it shares); "
               f"the busiest resource of (a), at the work it really did, bounds it at {lb_a:.1f}, so no schedule of "
               f"that work on this split beats (c) by more than {lb_c / lb_a:.2f}x. Where (c) loses is what the model charges it: "
               f"training each policy on all devices at the profile's data-parallel scaling, decoding at low batch per device, swapping each "
               f"policy's states off the devices, each generation phase waiting for its longest row, and every phase "
               f"waiting for the other.")
    return out


def main(args) -> int:
    base = yaml.safe_load(Path(args.config).read_text())
    load_before = load_now()
    reps, split = [], None
    for rep in range(args.repeats):
        print(f"--- repetition {rep + 1}: (c) trainer-centred on {args.devices} emulated devices", flush=True)
        c = run_colocated(base, args, rep)
        rows = c.pop("_rows")
        if split is None:
            from astraflow.emulation.cost import CostModel
            from astraflow.emulation.profile import load_profile
            from astraflow.emulation.profile import load_workload
            sigma = load_workload(args.workload).length_sigma if args.workload else 0.0
            cost = CostModel(load_profile(args.profile), args.token_scale, args.prompt_token_scale, sigma)
            split = choose_split(c["work_by_policy"], rows, args.devices, cost, args.steps)
            print(f"    split: {split['split']} (priced bound {split['priced_bound_s_per_iter']:.1f} s/iter)", flush=True)
        out = {"colocated": c}
        for barrier in ("async", "lockstep"):
            print(f"--- repetition {rep + 1}: ({'a' if barrier == 'async' else 'b'}) {barrier}", flush=True)
            out[barrier] = run_split(base, args, split["split"], barrier, rep)
        reps.append(out)
    agg = aggregate(reps)
    print_table(agg, split, args)
    result = {"benchmark": "multi_policy_emulated", "emulated": True, "profile": args.profile,
              "devices": args.devices, "polls_in_flight": args.polls_in_flight, "dilation": args.dilation,
              "token_scale": args.token_scale, "prompt_token_scale": args.prompt_token_scale,
              "workload": args.workload or None, "max_staleness": args.max_staleness, "max_new_tokens_modelled": args.max_new_tokens_modelled,
              "max_new_tokens_real": real_max_new_tokens(args),
              "steps": args.steps, "repeats": args.repeats, "config": args.config, "quick": args.quick,
              "shape": SEED_SHAPE, "seed_reference": {"trainer_centred_s_per_iter": 212.64, "ours_s_per_iter": 77.65,
                                                      "speedup": 2.74, "hardware": "8 x H100, Qwen3-8B"},
              "device_split": split, "method": __doc__, "notes": notes(agg, split, args), **agg,
              "repetitions": reps, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_results(args.out, result, load_before)
    return 0


# -- the split re-priced on (a)'s own runs --------------------------------------------------
#: the settings of a written Table 2 that ``--reprice`` measures with (the same as its arms')
TABLE2_SETTINGS = ("profile", "devices", "polls_in_flight", "dilation", "token_scale", "prompt_token_scale",
                   "workload", "max_staleness", "max_new_tokens_modelled", "steps", "config")
REPRICED = "repriced"


def repriced_split(table2: dict) -> dict:
    """The split of Table 2's devices priced on its own (a) repetitions (each resource's work
    inside the steady window, :func:`split_from_runs`), instead of on (c)'s calls: the first rule
    prices a pool by (c)'s calls dealt over its devices, but (a)'s pools decode deeper batches
    (several polls in flight) and do less work than that, and its trainers not exactly what (c)'s
    training rescaled says; a second pass on what (a) really did moves devices accordingly."""
    from astraflow.emulation.profile import load_profile
    first = table2["device_split"]
    # disjoint placements only: this rule's pool of d devices does its device-seconds over d, which
    # credits a pool given more devices with a speed-up that decoding bound by its longest rows does
    # not give (measured, stop 52: the verifier's pool 51 s on 1 device, 46 s on 2, priced 26), and
    # so would take turns on devices where that loses (the turn-taking's own price aside)
    best = split_from_runs(first["split"], [r["async"] for r in table2["repetitions"]], "work_in_window_by_resource",
                           table2["devices"], load_profile(table2["profile"]).efficiency.train_scaling,
                           first["min_train_devices"])
    if best is None:
        raise ValueError(f"{table2['devices']} devices cannot hold the pools and trainers")
    return {**best, "min_train_devices": first["min_train_devices"],
            "rule": "minimise the largest priced stage, priced on Table 2's (a) repetitions: a pool of d devices = its "
                    "node's work in the steady window x its devices / d, a trainer of d >= min_train_devices devices = "
                    "its work there x d0*s(d0) / (d*s(d))"}


def steady_table2(path: str, purpose: str) -> dict:
    """A written Table 2 with steady windows in its (a) repetitions (what ``--reprice`` and
    ``--tune`` start from), or an exit saying there is none to ``purpose``."""
    table2 = json.loads(Path(path).read_text())
    if not table2.get("repetitions") or "work_in_window_by_resource" not in table2["repetitions"][0]["async"]:
        raise SystemExit(f"{path}: no steady-window Table 2 to {purpose} (run multi_policy --emulated first)")
    return table2


def with_table2_settings(args, table2: dict) -> dict:
    """``args`` takes Table 2's recorded settings (the arms measured after it run as its did);
    returns its job config."""
    for k in TABLE2_SETTINGS:
        setattr(args, k, table2[k] if table2[k] is not None else "")
    return yaml.safe_load(Path(args.config).read_text())


def reprice_main(args) -> int:
    """``multi_policy --emulated --reprice``: (a) (and (b)) again on the split re-priced from the
    written Table 2's own (a) runs (:func:`repriced_split`), with its settings, against its (c)
    repetitions paired by index; writes the file's ``repriced`` section (Table 2 stays)."""
    table2 = steady_table2(args.out, "re-price")
    base = with_table2_settings(args, table2)
    split = repriced_split(table2)
    print(f"EMULATED: Table 2's split {table2['device_split']['split']} re-priced on its (a) runs: {split['split']} "
          f"(priced bound {split['priced_bound_s_per_iter']:.1f} s/iter; {split['rule']})", flush=True)
    if split["split"] == table2["device_split"]["split"]:
        print("the re-priced split is Table 2's: nothing new to measure")
        write_section(args.out, REPRICED, {"emulated": True, "split": split, "same_as_table2": True, "measured": False,
                                           "table2_created": table2.get("created")}, None, "multi_policy_emulated")
        return 0
    load_before = load_now()
    section = measure_on_split(args, table2, base, split, "re-priced")
    write_section(args.out, REPRICED, section, load_before, "multi_policy_emulated")
    return 0


def measure_on_split(args, table2: dict, base: dict, split: dict, label: str) -> dict:
    """(a) (and (b), ``args.reprice_arms``) ``args.repeats`` times on ``split["split"]`` with
    Table 2's settings, each repetition paired with Table 2's (c) and (a) of the same index: the
    section ``--reprice`` and ``--tune`` write."""
    arms = [a for a in ("async", "lockstep") if a in args.reprice_arms]
    reps = []
    for rep in range(args.repeats):
        row = {}
        for barrier in arms:
            print(f"--- repetition {rep + 1}: {barrier} on the {label} split", flush=True)
            row[barrier] = run_split(base, args, split["split"], barrier, rep)
        reps.append(row)
    c = [r["colocated"]["s_per_iter"] for r in table2["repetitions"]]
    table_a = [r["async"]["s_per_iter"] for r in table2["repetitions"]]
    section = {"emulated": True, "split": split, "arms": {}, "table2_created": table2.get("created"),
               "pairing": "repetition i of each arm with repetition i of Table 2's (c) and (a) (same settings, seeds "
                          "and config; measured in another invocation)",
               "repetitions": reps}
    for arm in arms:
        per = [r[arm] for r in reps]
        s = [x["s_per_iter"] for x in per]
        n = min(len(s), len(c))
        section["arms"][arm] = {
            "s_per_iter": spread(s), "lower_bound_s_per_iter": spread([x["lower_bound_s_per_iter"] for x in per]),
            "scheduling_efficiency": spread([x["lower_bound_s_per_iter"] / x["s_per_iter"] for x in per]),
            "busiest": [x["busiest"] for x in per], "overruns": spread([x["overruns"] for x in per]),
            "work_in_window_by_resource": spread_each(per, "work_in_window_by_resource"),
            **({"shared_resources": spread_each(per, "shared_resources")} if "shared_resources" in per[0] else {}),
            "max_cpu_fraction": spread([max(x["cpu_fraction"].values()) for x in per]),
            "speedup_vs_sequential": ratio_spread(spread(c[:n]), spread(s[:n])) if n else None,
            "speedup_vs_table2_async": ratio_spread(spread(table_a[:n]), spread(s[:n])) if n else None}
    if {"async", "lockstep"} <= section["arms"].keys():
        section["arms"]["async"]["speedup_vs_lockstep"] = ratio_spread(section["arms"]["lockstep"]["s_per_iter"],
                                                                       section["arms"]["async"]["s_per_iter"])
    for arm, r in section["arms"].items():
        print(f"{ARMS[arm] + ', ' + label:34} s/iter {fmt_spread(r['s_per_iter'], '.1f')}  bound "
              f"{fmt_spread(r['lower_bound_s_per_iter'], '.1f')}  eff {fmt_spread(r['scheduling_efficiency'])}  "
              f"vs (c) {fmt_spread(r['speedup_vs_sequential']) if r['speedup_vs_sequential'] else '-'}")
    return section


# -- the split tuned by measuring (a) --------------------------------------------------------
TUNED = "tuned"
#: a probe replaces the current split when its (a) is this much faster (Table 2's (a) spreads
#: about this much over its repetitions: a smaller gain in one run is not one)
TUNE_GAIN = 0.05
TUNE_RULE = ("start from Table 2's split and its (a) (median of its repetitions); each round, move one device to the "
             "stage whose work in (a)'s steady window is largest from the least busy stage that can spare one (a "
             f"pool keeps >= 1, a trainer >= min_train_devices), run (a) once on it, and keep it when it is "
             f">= {TUNE_GAIN:.0%} faster; stop at the first probe that is not (or after --tune-rounds)")


def stage_work(work: dict[str, float]) -> dict[tuple[str, str], float]:
    """Window work per (policy, stage): a pool's nodes added."""
    out: dict[tuple[str, str], float] = {}
    for comp, v in work.items():
        st = stage_of(comp)
        out[st] = out.get(st, 0.0) + v
    return out


def next_move(split: dict[str, dict[str, int]], work: dict[str, float], need: int,
              tried: list[dict]) -> dict | None:
    """The next split to probe (:data:`TUNE_RULE`): a device from the least busy stage that can
    spare one to the busiest, not a split already ``tried``; None when there is none."""
    by_stage = stage_work(work)
    to = max(by_stage, key=by_stage.get)
    for frm in sorted((k for k in by_stage if k != to), key=by_stage.get):
        if split[frm[0]][frm[1]] <= (1 if frm[1] == "rollout" else need):
            continue
        moved = copy.deepcopy(split)
        moved[frm[0]][frm[1]] -= 1
        moved[to[0]][to[1]] += 1
        if moved not in tried:
            return {"split": moved, "from": ".".join(frm), "to": ".".join(to)}
    return None


def tune_main(args) -> int:
    """``multi_policy --emulated --tune``: the split found by measuring (a) (:data:`TUNE_RULE`),
    then (a) and (b) ``--repeats`` times on it, paired with Table 2's (c) repetitions; writes
    the file's ``tuned`` section with every probe (Table 2 stays). The probes choose; the
    repetitions after them measure (a probe's one run is never the result)."""
    table2 = steady_table2(args.out, "tune from")
    start = table2["device_split"]["split"]
    if any("shared" in parts for parts in start.values()):
        raise SystemExit(f"{args.out}: Table 2's split has a shared placement; --tune moves devices between disjoint "
                         f"stages only")
    base = with_table2_settings(args, table2)
    need = table2["device_split"]["min_train_devices"]
    a = table2["arms"]["async"]
    cur = {"split": start, "s_per_iter": a["s_per_iter"]["median"],
           "work": {k: v["median"] for k, v in a["work_in_window_by_resource"].items()}}
    print(f"EMULATED: tuning Table 2's split {start} ((a) {cur['s_per_iter']:.1f} s/iter); {TUNE_RULE}", flush=True)
    load_before = load_now()
    probes, tried = [], [start]
    for i in range(args.tune_rounds):
        move = next_move(cur["split"], cur["work"], need, tried)
        if move is None:
            break
        tried.append(move["split"])
        print(f"--- probe {i + 1}: a device from {move['from']} to {move['to']}: {move['split']}", flush=True)
        r = run_split(base, args, move["split"], "async", 100 + i)
        keep = r["s_per_iter"] <= cur["s_per_iter"] * (1 - TUNE_GAIN)
        probes.append({**move, "accepted": keep, "against_s_per_iter": cur["s_per_iter"],
                       **{k: r[k] for k in ("s_per_iter", "lower_bound_s_per_iter", "scheduling_efficiency", "busiest",
                                            "work_in_window_by_resource", "overruns", "run_dir")}})
        print(f"    (a) {r['s_per_iter']:.1f} s/iter against {cur['s_per_iter']:.1f}: {'kept' if keep else 'not kept'}",
              flush=True)
        if not keep:
            break
        cur = {"split": move["split"], "s_per_iter": r["s_per_iter"], "work": r["work_in_window_by_resource"]}
    split = {"split": cur["split"], "rule": TUNE_RULE, "min_train_devices": need, "from_split": start}
    if cur["split"] == start:
        print("no probe was faster: Table 2's split stays")
        section = {"emulated": True, "split": split, "same_as_table2": True, "measured": False, "probes": probes,
                   "table2_created": table2.get("created")}
    else:
        section = {**measure_on_split(args, table2, base, split, "tuned"), "probes": probes}
    write_section(args.out, TUNED, section, load_before, "multi_policy_emulated")
    return 0


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, ReadmeRow, heading, fmt_spread as _sp)


REPORT_TITLE = "Multi-policy at the seed's scale, EMULATED"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md: Table 2 from ``multi_policy_emulated.json``, with the
    splits found after it (``--reprice``, ``--tune``)."""
    d = load("multi_policy_emulated")
    if not d:
        return []
    split = "; ".join(f"{p}: {placement(x)}" for p, x in d["device_split"]["split"].items())
    # the splits found after Table 2 (of this Table 2: a section of an older one is not shown)
    later = {k: d[k] for k in ("repriced", "tuned") if d.get(k) and d[k].get("table2_created") == d.get("created")}
    out = [*heading(REPORT_TITLE),
           f"**Multi-policy at the seed's scale, EMULATED** — `python -m astraflow.benchmarks.multi_policy --emulated` "
           f"(solver–verifier, {d['shape']['groups_per_batch']} prompts × {d['shape']['n_samples']} samples per batch, "
           f"{d['shape']['minibatches']} PPO minibatches; **{d['devices']} emulated {d['profile']} devices**: the tiny "
           f"model computes, each call is held for the cost model's time; **modelled seconds**, not GPU measurements; "
           f"{d['steps']} iterations per arm, median (min–max) of {d['repeats']} repetitions; "
           f"{_report_lengths(d)}; split of (a)/(b) chosen by the benchmark's rule: {split})", "",
           "| arm (emulated) | modelled s / iteration | lower bound s / iteration | scheduling efficiency | "
           "speed-up vs (c) | max CPU share of a hold |",
           "|---|---:|---:|---:|---:|---:|"]
    labels = {"async": "(a) ours: disjoint devices, async", "lockstep": "(b) the same, `barrier: lockstep`",
              "colocated": "(c) trainer-centred: one controller, all devices colocated"}
    for arm, label in labels.items():
        r = d["arms"][arm]
        vs = _sp(r["speedup_vs_sequential"]) + "x" if "speedup_vs_sequential" in r else "1"
        out.append(f"| {label} | {_sp(r['s_per_iter'], '.1f')} | {_sp(r['lower_bound_s_per_iter'], '.1f')} | "
                   f"{_sp(r['scheduling_efficiency'])} | {vs} | {_sp(r['max_cpu_fraction'])} |")
    how = {"repriced": ("re-priced", "--reprice"), "tuned": ("tuned", "--tune")}
    for key, sec in later.items():
        for arm, r in (sec.get("arms") or {}).items():
            tag = {"async": "(a)", "lockstep": "(b)"}[arm]
            out.append(f"| {tag} on the {how[key][0]} split (`{how[key][1]}`, {r['s_per_iter']['n']} repetitions) | "
                       f"{_sp(r['s_per_iter'], '.1f')} | {_sp(r['lower_bound_s_per_iter'], '.1f')} | "
                       f"{_sp(r['scheduling_efficiency'])} | {_sp(r['speedup_vs_sequential'])}x | "
                       f"{_sp(r['max_cpu_fraction'])} |")
    out += ["", f"(a) vs (b): {_sp(d['speedup_vs_lockstep'])}x. The seed reports 2.74x on real 8 × H100 "
                "(212.64 → 77.65 s/iter). " + " ".join(d["notes"][2:]), ""]
    for key, sec in later.items():
        out += [_report_later_split(key, sec), ""]
    return out


def _report_later_split(key: str, sec: dict) -> str:
    """One line on a split found after Table 2: how, what it measured, how it pairs."""
    parts = "; ".join(f"{p}: {placement(x)}" for p, x in sec["split"]["split"].items())
    if key == "repriced":
        line = (f"Re-priced on (a)'s own steady windows (`--reprice`): {parts}, priced bound "
                f"{sec['split']['priced_bound_s_per_iter']:.1f} s/iter")
    else:
        probes = "; ".join(f"{p['from']} → {p['to']}: (a) {p['s_per_iter']:.1f} s/iter against "
                           f"{p['against_s_per_iter']:.1f}, {'kept' if p['accepted'] else 'not kept'}"
                           for p in sec.get("probes", []))
        line = (f"Tuned by measuring (a) (`--tune`: a device to the busiest stage of the steady window from the least "
                f"busy that can spare one, one run per probe, kept when ≥ 5 % faster; probes: {probes or 'none'}): "
                f"{parts}")
    if sec.get("same_as_table2"):
        return line + " — the rule's split again, so nothing more to measure."
    a = (sec.get("arms") or {}).get("async") or {}
    return line + (" — measured in its own invocation, each repetition paired with Table 2's (c) repetition of the "
                   "same index (same settings, seeds and config)"
                   + (f"; (a) vs (b) there {_sp(a['speedup_vs_lockstep'])}x" if "speedup_vs_lockstep" in a else "")
                   + (f"; vs Table 2's (a) {_sp(a['speedup_vs_table2_async'])}x" if a.get("speedup_vs_table2_async")
                      else "") + ".")


def _report_lengths(d: dict) -> str:
    """How a Table 2 result priced its lengths (results before the workload option had none)."""
    cap = d.get("max_new_tokens_modelled")
    cap_s = f"length cap {cap} modelled tokens" if cap else f"token_scale {d.get('token_scale')}"
    if d.get("workload"):
        return f"{cap_s}, lengths spread by the `{d['workload']}` workload (emulation/profiles.yaml)"
    return f"{cap_s}, the tiny model's lengths scaled"


def readme_row(load: Loader) -> ReadmeRow | None:
    """The README's line: modelled s per iteration of (a), (b), (c), and (a) on the tuned split if measured."""
    d = load("multi_policy_emulated")
    if not d:
        return None
    s = {k: r["s_per_iter"]["median"] for k, r in d["arms"].items()}
    tuned = d.get("tuned") if (d.get("tuned") or {}).get("table2_created") == d.get("created") else None
    a_tuned = ((tuned or {}).get("arms") or {}).get("async")
    return ReadmeRow(REPORT_TITLE, f"modelled s / iteration on {d['devices']} {d['profile']}, median of {d['repeats']}",
                     f"async {s['async']:.1f} · lockstep {s['lockstep']:.1f} · trainer-centred {s['colocated']:.1f}"
                     + (f" · async, tuned split {a_tuned['s_per_iter']['median']:.1f}" if a_tuned else ""),
                     "lower", emulated=True)
