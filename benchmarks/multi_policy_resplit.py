"""Table 2's device split chosen again, after Table 2 ran: ``multi_policy --emulated --reprice`` and ``--tune``.

``--reprice`` prices the split on what Table 2's own (a) runs did in their steady windows
instead of on (c)'s calls; ``--tune`` moves a device at a time to the busiest stage, keeping a
move only when measuring (a) on it is faster. Either then measures (a) (and (b)) on its split
with Table 2's settings, paired with Table 2's repetitions, and writes its own section of
``multi_policy_emulated.json`` (Table 2 stays). Knows a written Table 2's layout and how to
move devices; running an arm is :mod:`.multi_policy_emulated_arms`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from astraflow.benchmarks.lib.device_split import split_from_runs
from astraflow.benchmarks.lib.emulated import stage_of
from astraflow.benchmarks.lib.results import load_now, repo_path, write_section
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread, spread_each
from astraflow.benchmarks.multi_policy_emulated_arms import ARMS, run_split
from astraflow.emulation.profile import load_profile


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
    args.config = str(repo_path(args.config))
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
