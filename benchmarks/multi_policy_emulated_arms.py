"""The arms of Table 2 (``multi_policy --emulated``): their job configs on emulated devices, and one run of each.

(c) trainer-centred is ``sequential_multi`` as its own process with every policy on all the
devices; (a) async and (b) lockstep are the team job with each policy's pool and trainer on
the devices a split gives them. Each run comes back as its steady window, its bound and its
emulated accounts, in modelled seconds. Knows how the arms are configured and run; choosing
the split is :mod:`.multi_policy_emulated` (and :mod:`.multi_policy_resplit`), and comparing
the arms is :mod:`.multi_policy_emulated`.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import yaml

from astraflow.benchmarks.lib.child import run_child
from astraflow.benchmarks.lib.device_split import devices_of_stage
from astraflow.benchmarks.lib.emulated import (cpu_fractions, episodes_fenced, episodes_worked, last_per_node,
                                               merge_shared, modelled_s, overruns, per_node, resource_work)
from astraflow.benchmarks.lib.run_metrics import read_rows, read_summary
from astraflow.benchmarks.lib.steady import steady_window, steps_for_window
from astraflow.benchmarks.multi_policy_arms import run_attempts, write_config
from astraflow.benchmarks.multi_policy_runs import analyse_team


#: the seed's shape: 256 samples per batch, 8 per prompt, 4 PPO minibatches
SEED_SHAPE = {"groups_per_batch": 32, "n_samples": 8, "minibatches": 4}
#: the seed's length cap per policy ("Max new tokens 4096 (per policy)", the AstraFlow docs'
#: Qwen3-8B actor + verifier recipe): each policy's real max_new_tokens is this / token_scale
SEED_MAX_NEW_TOKENS = 4096


ARMS = {"async": "(a) ours, async", "lockstep": "(b) lockstep", "colocated": "(c) trainer-centred",
        "async_partial": "(a) with partial rollouts"}


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


def split_config(base: dict, args, split: dict[str, dict[str, int]], barrier: str, job: str, run_dir: str,
                 partial: bool = False) -> dict:
    """(a) / (b): each policy's pool and trainer on their own devices (``split[policy][stage]``),
    training past the steady window's end (:func:`steps_for_window`) so its pools still have
    work in flight when the window closes."""
    data = shaped(base, args)
    data.update(job=job, barrier=barrier, run_dir=run_dir)
    data["trainer"]["steps"] = steps_for_window(args.steps, args.max_staleness)
    for p, parts in split.items():
        sec = data.setdefault("policies", {}).setdefault(p, {})
        # a shared policy's pool and trainer name the same devices and take turns on them
        share = {"share": p} if "shared" in parts else {}
        sec.setdefault("rollout", {}).update(device={**device(args, devices_of_stage(parts, "rollout")), **share},
                                             nodes=1, tasks_per_call=SEED_SHAPE["groups_per_batch"],
                                             polls_in_flight=args.polls_in_flight)
        sec.setdefault("trainer", {})["device"] = {**device(args, devices_of_stage(parts, "trainer")), **share}
        if partial:  # rows in flight go on under each new version (emulation/partial.py)
            sec["rollout"]["partial"] = True
    return data


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


def run_colocated(base: dict, args, rep: int) -> dict:
    """(c) as its own Python process on its config file; modelled seconds."""
    with tempfile.TemporaryDirectory() as d:
        cfg_path = Path(d) / "colocated.yaml"
        data = colocated_config(base, args)
        data["job"] = f"bench-mpe-colocated-{rep}"
        cfg_path.write_text(yaml.safe_dump(data, sort_keys=False))
        r = run_child("astraflow.benchmarks.sequential_multi", ["--config", str(cfg_path), "--steps", str(args.steps),
                                                                "--threads", "1", "--no-eval"], "(c)")
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


def weights_waits(rows: list[dict], dilation: float) -> dict[str, float]:
    """Per RaaS node, the modelled seconds a version it loaded had waited for its engine (its
    calls in flight), per load: each node's last ``raas.weights_wait_s`` over its last
    ``raas.weights_loads``."""
    waited, loads = per_node(rows, "raas.weights_wait_s"), per_node(rows, "raas.weights_loads")
    return {n: waited.get(n, 0.0) / dilation / loads[n] for n in sorted(loads) if loads[n]}


def run_split(base: dict, args, split: dict, barrier: str, rep: int, partial: bool = False,
              config=None, shared: dict[str, str] | None = None) -> dict:
    """One run of (a) or (b) on ``split`` (or of the job ``config(job, run_dir)`` builds, whose
    components sharing devices ``shared`` maps to their resource): its steady window and accounts."""
    from astraflow.config import load_config  # the job machinery (~1 s to import): only when an arm runs
    from astraflow.launcher import run_job

    if shared is None:
        shared = {p for p, parts in split.items() if "shared" in parts}  # pools and trainers taking turns

    def once(job: str) -> dict:
        data = (config(job, str(args.run_root)) if config is not None else
                split_config(base, args, split, barrier, job, str(args.run_root), partial))
        path = write_config(data, Path(args.run_root))
        run_dir = Path(args.run_root) / job
        cfg = load_config(path)
        run_job(cfg, run_dir=run_dir, progress=False, timeout_s=args.run_timeout)
        r = analyse_team(run_dir)
        summary = read_summary(run_dir)
        rows = read_rows(run_dir)
        fenced = episodes_fenced(rows)
        trained = steps_for_window(args.steps, args.max_staleness)
        work = resource_work(summary, episodes_worked(rows), SEED_SHAPE["groups_per_batch"], trained)
        whole = merge_shared(work, shared)
        em = summary.get("emulated", {})
        batches = r["episodes"] / SEED_SHAPE["groups_per_batch"]
        calls = {comp: d.get("generate", {}).get("calls", 0) / batches for comp, d in em.items()
                 if "generate" in d and batches}
        return {**steady_window(rows, r["last_policy"], args.max_staleness, args.dilation, shared, args.steps),
                "generate_calls_per_iteration": calls, "fenced_episodes": fenced,
                # what a long run needs of each resource: its whole-run work per batch (a short run's
                # pools also did, before the window, the batches the first steps train)
                "work_by_resource": work, "busiest_whole_run": max(whole, key=whole.get),
                # the cross-check no steady state beats: the busiest resource's work per batch over
                # the whole run (a window measured faster than it took in work done outside it)
                "whole_run_bound_s_per_iter": max(whole.values()),
                "cpu_fraction": cpu_fractions(summary.get("emulated", {})),
                "overruns": overruns(summary.get("emulated", {})),
                "episodes_per_trained_group": r["episodes"] / (trained * SEED_SHAPE["groups_per_batch"]),
                "trained_steps": trained,
                # the time weights wait to be loaded (modelled s per load, per node), and the rows a
                # partial rollout continued under a newer version
                "weights_wait_s_per_load": weights_waits(rows, args.dilation),
                "partial_rows": last_per_node(rows, "raas.partial_rows"),
                "by_policy": r["by_policy"], "run_dir": str(run_dir), "wall_s": r["wall_s"],
                # a role served by the other pool: median / p95 seconds per call (modelled) and hops per episode
                "remote_calls": {k: (v / args.dilation if k.endswith("_s") else v)
                                 for k, v in r["remote_calls"].items()}}
    return run_attempts(f"emulated-{barrier}{'-partial' if partial else ''}", rep, once)
