"""The comparison of ``multi_policy``'s arms: spreads over repetitions, paired ratios, the table
and the notes written from the numbers.

Every ratio is paired within its repetition; arms a run of ``--arms`` left out are left out
here too. Knows the shape of each arm's result; knows nothing about how the arms ran.
"""

from __future__ import annotations

from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.benchmarks.lib.table import print_header
from astraflow.benchmarks.multi_policy_alone import COMPARISONS, pooled_accuracies, standard_errors


KAFKA_ARMS = ("async", "lockstep")


def aggregate(reps: list[dict], problems: int | None = None) -> dict:
    """Spreads over repetitions; every ratio paired within its repetition. Arms a repetition
    did not run (``--arms``) are left out; ``problems``: held-out problems per evaluation
    (for the standard errors; ``None``: none computed)."""
    def s(arm: str, key: str) -> dict:
        return spread([r[arm][key] for r in reps])

    ran = [arm for arm in ("async", "lockstep", "sequential", "solver_alone") if all(arm in r for r in reps)]
    arms = {arm: {k: s(arm, k) for k in ("s_per_iter", "time_to_last_step_s", "team_accuracy", "raas_busy_s",
                                         "groups_dropped", "remote_wait_s_per_call", "episodes_per_trained_group",
                                         "generated_tokens")
                  if all(r[arm].get(k) is not None for r in reps)} for arm in KAFKA_ARMS if arm in ran}
    for arm in KAFKA_ARMS:  # a role served by the other pool: wall seconds per call and hops per episode
        if arm in ran and all(r[arm].get("remote_calls", {}).get("calls") for r in reps):
            arms[arm]["remote_calls"] = {k: spread([r[arm]["remote_calls"][k] for r in reps])
                                         for k in ("median_s", "p95_s", "hops_per_episode")}
    if "sequential" in ran:
        arms["sequential"] = {"s_per_iter": s("sequential", "s_per_iter"),
                              "time_to_last_step_s": s("sequential", "time_to_last_step_s"),
                              "team_accuracy": s("sequential", "team_accuracy_final"),
                              **{k: s("sequential", k) for k in reps[0]["sequential"]
                                 if k.startswith(("G_", "T_", "W_")) and k.endswith("_s")},
                              "threads": reps[0]["sequential"]["threads"]}
    out: dict = {}
    rates = {arm: arms[arm]["s_per_iter"] for arm in ("async", "lockstep", "sequential") if arm in arms}
    if rates:
        out["s_per_iter"] = rates
    for key, slow, fast in (("speedup_vs_sequential", "sequential", "async"),
                            ("speedup_vs_lockstep", "lockstep", "async"),
                            ("lockstep_speedup_vs_sequential", "sequential", "lockstep")):
        if slow in rates and fast in rates:
            out[key] = ratio_spread(rates[slow], rates[fast])
    out["team_accuracy"] = arms["async"]["team_accuracy"]
    out["team_accuracy_initial"] = spread([r["async"]["team_accuracy_by_version"]["0"] for r in reps])
    out["verifier"] = {k: spread([r["async"]["verifier"][k] for r in reps])
                       for k in ("accuracy", "tpr", "tnr", "retries", "first_accuracy")
                       if all(r["async"].get("verifier", {}).get(k) is not None for r in reps)}
    if "solver_alone" in ran:
        if all("accuracy_best_evaluated" in r["solver_alone"] for r in reps):
            out["solver_alone_accuracy_best_evaluated"] = s("solver_alone", "accuracy_best_evaluated")
        arms["solver_alone"] = {"accuracy": s("solver_alone", "accuracy"),
                                "version_reached": s("solver_alone", "version_reached"),
                                "seconds": s("solver_alone", "seconds")}
        out["solver_alone_accuracy"] = arms["solver_alone"]["accuracy"]
        eq = [r["solver_alone"].get("equal_tokens") for r in reps]
        if all(e and e["reached"] for e in eq):
            arms["solver_alone"]["equal_tokens"] = {k: spread([e[k] for e in eq])
                                                    for k in ("tokens", "seconds", "version_reached", "accuracy")}
            out["solver_alone_accuracy_equal_tokens"] = arms["solver_alone"]["equal_tokens"]["accuracy"]
        if problems:
            out["standard_errors"] = standard_errors(reps, problems)
            out.update(pooled_accuracies(out["standard_errors"]["by_repetition"], out))
    out.update({
        "failed_runs": [{"repetition": i + 1, "arm": arm, **f} for i, r in enumerate(reps)
                        for arm in (*KAFKA_ARMS, "solver_alone") if arm in r
                        for f in r[arm].get("failed_attempts", [])],
        # (unknown, None, for arms re-read from their run dirs after the fact)
        "load_1m_at_arm_start": spread(loads) if (loads := [r[arm]["load_before"][0] for r in reps for arm in ran
                                                            if r[arm].get("load_before")]) else None,
        "arms": arms,
    })
    return out


DEFINITIONS = {
    "s_per_iter": "seconds per iteration (every policy one step), steady state: see method",
    "speedup_vs_sequential": "s_per_iter (c) / s_per_iter (a), paired per repetition (> 1: async is faster)",
    "speedup_vs_lockstep": "s_per_iter (b) / s_per_iter (a), paired per repetition (> 1: async is faster)",
    "lockstep_speedup_vs_sequential": "s_per_iter (c) / s_per_iter (b), paired per repetition",
    "team_accuracy": "(a)'s held-out eval.team_accuracy at its final versions",
    "solver_alone_accuracy": "(d)'s held-out eval.accuracy of the newest evaluated version it had trained "
                             "within (a)'s time from launch to (a)'s last trained step",
    "solver_alone_accuracy_equal_tokens": "(d)'s held-out eval.accuracy of the newest evaluated version it had "
                                          "trained when its pool had generated (a)'s raas.generated_tokens",
    "standard_errors": "per repetition: each accuracy with its binomial SE over eval.problems x eval.k, and "
                       "team - alone with the SE of the difference",
    "verifier": "(a)'s verifier on its training episodes of the run's last half: accuracy, tpr, tnr, retries",
    "team_accuracy_equal_tokens": "team_accuracy itself: the team is measured once, at its end; the solver alone "
                                  "is read at the team's wall-clock or at its generated tokens",
    "mean, se, se_upper": "on each headline accuracy: the mean over repetitions and its SE (sqrt(sum se_i^2) / "
                          "repetitions, from standard_errors.by_repetition)",
    "solver_alone_accuracy_best_evaluated": "(d)'s best held-out accuracy at any version it evaluated in its whole "
                                            "run (--alone-run-factor x (a)'s wall-clock): a bound in its favour "
                                            "(--alone-eval exported: of version 0, the versions read and its newest "
                                            "export)",
    "team_minus_alone": "per comparison (equal_wall_clock, equal_tokens, best_evaluated): the mean of team - alone over "
                        "repetitions, its SE, and the difference in SEs (in_se: binomial over problems x k; "
                        "in_se_upper: problems only, the bound when a problem's k samples are all alike)",
}


def notes(agg: dict, threads: int, steps: int, eval_every: int) -> list[str]:
    """What the numbers say, in words (written from them, not before)."""
    out = []
    rates = agg.get("s_per_iter", {})
    if all(k in rates for k in ("async", "lockstep", "sequential")):
        out += schedule_notes(agg, threads)
    if "solver_alone_accuracy" in agg:
        out += accuracy_notes(agg, steps, eval_every)
    t0 = agg["team_accuracy_initial"]["median"]
    team = agg["team_accuracy"]["median"]
    others = {label: agg["arms"][arm]["team_accuracy"]["median"] for arm, label in
              (("async", "(a)"), ("lockstep", "(b)"), ("sequential", "(c)")) if arm in agg["arms"]}
    if len(others) == 3 and max(others.values()) < t0:
        out.append(f"Team training lowered the team's held-out accuracy in every team arm: {t0:.3f} at version 0, "
                   f"then " + ", ".join(f"{v:.3f} {k}" for k, v in others.items()) + f" after {steps} iterations. "
                   f"The one-process baseline falls as far, so the schedule is not the cause: the workflow or its "
                   f"settings are.")
    else:
        out.append(f"The team's held-out accuracy went {t0:.3f} at version 0 -> {team:.3f} (a) after {steps} "
                   f"iterations.")
    if len(rates) > 1:
        out.append("The seed's 2.7x (8xH100, 212.64 -> 77.65 s/iter) comes from pools and trainers on separate "
                   "devices; a 2-core box cannot show it, and these numbers say nothing about it either way.")
    return out


def accuracy_notes(agg: dict, steps: int, eval_every: int) -> list[str]:
    team, alone = agg["team_accuracy"]["median"], agg["solver_alone_accuracy"]["median"]
    d = agg["arms"]["solver_alone"]
    out = [f"At equal wall-clock ({d['seconds']['median']:.0f} s from launch) the team's held-out accuracy is "
           f"{team:.3f} and the solver alone's {alone:.3f}: the solver alone trained "
           f"{d['version_reached']['median']:.0f} versions against the team's {steps} per policy (one pool, one "
           f"trainer, no verifier calls, all on the same 2 cores), its evaluator running every {eval_every} "
           f"versions meanwhile."]
    if "solver_alone_accuracy_equal_tokens" in agg:
        e = d["equal_tokens"]
        out.append(f"At equal generated tokens ({e['tokens']['median']:.0f}, every role's own) the solver alone "
                   f"had trained {e['version_reached']['median']:.0f} versions ({e['seconds']['median']:.0f} s) and "
                   f"scored {e['accuracy']['median']:.3f}.")
    for key, d in agg.get("team_minus_alone", {}).items():
        verdict = ("beats" if d["in_se"] >= 2 else "is not 2 SE above") if d["diff"] > 0 else "is not above"
        out.append(f"Over the {d['repetitions']} repetitions the team {verdict} the solver alone "
                   f"{COMPARISONS[key]}: {d['diff']:+.3f} +- {d['se']:.3f} ({d['in_se']:+.1f} SE binomial, "
                   f"{d['in_se_upper']:+.1f} SE counting problems only), ahead in {d['repetitions_team_ahead']} of "
                   f"{d['repetitions']}.")
    for i, row in enumerate(agg.get("standard_errors", {}).get("by_repetition", [])):
        parts = [f"repetition {i + 1} ({row['problems']} problems x k={row['k']}): team "
                 f"{row['team']['accuracy']:.3f} +- {row['team']['se']:.3f}"]
        for key, label in (("wall_clock", "equal wall-clock"), ("tokens", "equal tokens")):
            if f"alone_equal_{key}" in row:
                a, diff = row[f"alone_equal_{key}"], row[f"team_minus_equal_{key}"]
                parts.append(f"alone at {label} {a['accuracy']:.3f} +- {a['se']:.3f} (team - alone "
                             f"{diff['diff']:+.3f}, {diff['in_se']:+.1f} SE)")
        out.append("; ".join(parts) + ".")
    return out


def schedule_notes(agg: dict, threads: int) -> list[str]:
    a, b, c = (agg["s_per_iter"][k]["median"] for k in ("async", "lockstep", "sequential"))
    out = []
    if c < a:
        out.append(
            f"(c) sequential wins on this 2-core box: {c:.2f} s/iter against {a:.2f} for (a) async "
            f"({agg['speedup_vs_sequential']['median']:.2f}x). Every process of the Kafka arms (broker, dataflow "
            f"with the evaluator, two RaaS nodes, two trainers) shares the same 2 cores, so the overlap of rollout "
            f"and training that async buys cannot help when each phase is CPU-bound and the cores are already "
            f"busy: overlapping only splits the same cores. On top, the Kafka arms pay per-step transport "
            f"(batches, weight deltas, generation requests for the verifier over Kafka, one request per episode), "
            f"process-level contention and the evaluator, while (c) runs one process with {threads} thread(s), "
            f"coalesces every role's calls of an iteration into one engine call and copies weights in memory.")
    else:
        out.append(f"(a) async is {agg['speedup_vs_sequential']['median']:.2f}x faster per iteration than (c) "
                   f"sequential ({a:.2f} vs {c:.2f} s/iter) even on 2 cores.")
    if b > a:
        out.append(f"(a) async beats (b) lockstep by {agg['speedup_vs_lockstep']['median']:.2f}x: without the "
                   f"barrier each policy writes its batch as soon as its own groups are in, not when every "
                   f"policy's are.")
    else:
        arms = agg["arms"]
        out.append(f"(b) lockstep is not slower than (a) async here ({b:.2f} vs {a:.2f} s/iter). Both policies "
                   f"get their groups from the same episodes, so with equal batch sizes their batches fill at "
                   f"about the same moment and the barrier rarely holds one back. The RaaS nodes were busy "
                   f"{arms['async']['raas_busy_s']['median']:.0f} s in (a) against "
                   f"{arms['lockstep']['raas_busy_s']['median']:.0f} s in (b)"
                   + (f", rolling out {arms['async']['episodes_per_trained_group']['median']:.2f} against "
                      f"{arms['lockstep']['episodes_per_trained_group']['median']:.2f} episodes per trained group"
                      if "episodes_per_trained_group" in arms["async"] and "episodes_per_trained_group" in
                      arms["lockstep"] else "")
                   + f", and (a) dropped {arms['async']['groups_dropped']['median']:.0f} group(s) (replaced by new "
                   f"episodes) against {arms['lockstep']['groups_dropped']['median']:.0f}.")
    return out


def print_table(agg: dict) -> None:
    arms = agg["arms"]
    hdr = f"{'arm':22} {'s/iter':>20} {'time to last step s':>22} {'held-out accuracy':>22}"
    print_header(hdr)
    labels = {"async": "(a) async", "lockstep": "(b) lockstep", "sequential": "(c) sequential"}
    for arm, label in labels.items():
        if arm not in arms:
            continue
        r = arms[arm]
        print(f"{label:22} {fmt_spread(r['s_per_iter']):>20} {fmt_spread(r['time_to_last_step_s'], '.1f'):>22} "
              f"{'team ' + fmt_spread(r['team_accuracy'], '.3f'):>22}")
    if "solver_alone" in arms:
        d = arms["solver_alone"]
        print(f"{'(d) solver alone':22} {'-':>20} {fmt_spread(d['seconds'], '.1f'):>22} "
              f"{'alone ' + fmt_spread(d['accuracy'], '.3f'):>22}")
        if "equal_tokens" in d:
            e = d["equal_tokens"]
            print(f"{'(d) at equal tokens':22} {'-':>20} {fmt_spread(e['seconds'], '.1f'):>22} "
                  f"{'alone ' + fmt_spread(e['accuracy'], '.3f'):>22}")
    for key in ("speedup_vs_sequential", "speedup_vs_lockstep", "lockstep_speedup_vs_sequential"):
        if key in agg:
            print(f"{key:32} {fmt_spread(agg[key])}")
    if agg.get("verifier"):
        print("verifier (a), training episodes, last half: " +
              ", ".join(f"{k} {fmt_spread(v, '.3f')}" for k, v in agg["verifier"].items()))
    for key, d in agg.get("team_minus_alone", {}).items():
        print(f"team - alone {COMPARISONS[key]} (mean of {d['repetitions']}): {d['diff']:+.3f} +- {d['se']:.3f} "
              f"({d['in_se']:+.1f} SE; {d['in_se_upper']:+.1f} SE counting problems only; team ahead in "
              f"{d['repetitions_team_ahead']}/{d['repetitions']})")
    for i, row in enumerate(agg.get("standard_errors", {}).get("by_repetition", [])):
        print(f"rep {i + 1}: team {row['team']['accuracy']:.3f}+-{row['team']['se']:.3f}" +
              "".join(f"; {k} {row[k]['diff']:+.3f}+-{row[k]['se']:.3f} ({row[k]['in_se']:+.1f} SE)"
                      for k in ("team_minus_equal_wall_clock", "team_minus_equal_tokens") if k in row))
