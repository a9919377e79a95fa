"""Async multi-policy vs lockstep vs a sequential single controller, and the solver alone.

Each repetition runs the solver-verifier team of ``examples/solver_verifier.yaml``
(shortened to ``--steps`` iterations; same prompts, seeds, ``groups_per_batch`` and
``n_samples`` in every arm) four ways on this machine:

* **(a) async**: ``astraflow run``'s machinery (``run_job``, which starts its own embedded
  broker), ``barrier: async``: each policy trains as soon as its own batch is full;
* **(b) lockstep**: the same with ``barrier: lockstep`` (every policy steps together);
* **(c) sequential**: ``sequential_multi.py`` as a fresh Python process, no broker:
  generate both roles' parts of the batch, train the solver, train the verifier, copy the
  weights (how a trainer-centred system runs the team), with every core;
* **(d) solver alone**: a single-policy ``rlvr`` job with the solver's settings, run for
  (a)'s wall-clock (launch to (a)'s last trained step; ``--alone-run-factor`` times that, so
  that it also reaches (a)'s generated tokens) and evaluated every ``--alone-eval-every``
  versions meanwhile (``--alone-eval live``), or (``--alone-eval exported``, for jobs whose
  evaluation is slower than their training, such as code in the sandbox) exporting every
  ``--alone-eval-every`` versions and evaluated after its run, on the exported versions the
  comparisons read (:func:`evaluate_exported`).

A repetition runs them in the order a, d, b, c (d needs a's time), each from cold start.
A Kafka arm that fails or hangs (``--run-timeout``) is recorded in ``failed_runs`` and run
once more.

**Seconds per iteration** (every policy one step). Kafka arms, from the trainers' metrics:
per policy, the time between the ``trainer.samples`` metrics of two steps divided by the
steps between them, from the end of step 2 (or of the first step to end after the
evaluator's version-0 evaluation, whichever is later: that evaluation shares the cores at
start-up) to the policy's last step; the iteration time is that of the policy whose last
step comes last. (c): the mean of iterations 3.. (generation + both train steps + weight
copies; its evaluation is outside the timing).

**Accuracy**: ``team_accuracy`` is (a)'s held-out ``eval.team_accuracy`` at its final
versions; ``solver_alone_accuracy`` is (d)'s held-out accuracy of the newest evaluated
version it had trained by (a)'s wall-clock; ``solver_alone_accuracy_equal_tokens`` that of
the newest evaluated version it had trained when its RaaS pool had generated as many tokens
(``raas.generated_tokens``: every role's own tokens, no context) as (a) did in its whole run.
All are the evaluator's own measurement (same problems, ``k``, temperature); each comes with
``se``, the binomial standard error over the ``eval.problems`` x ``eval.k`` samples
(``sqrt(p (1 - p) / (problems k))``; ``se_upper`` counts problems only, the bound when a
problem's k samples are all alike), and ``team_minus_*`` is the difference team - alone in
units of the two SEs combined. (a)'s verifier: its accuracy, true-positive and true-negative
rates on the training episodes of the run's last half (rollout temperature), from the
episode metrics.

``--config`` names another team (its section of the results: its file's name, e.g.
``--config examples/smollm2_solver_verifier.yaml``, the team and the solver alone on
SmolLM2-135M-Instruct, whose arms need a longer ``--run-timeout`` than the tiny models').
``--set KEY=VALUE`` overrides a key of the team config in every arm (e.g.
``workflow.params.retry=fresh``, ``eval.problems=400``); ``--arms`` runs a subset (e.g.
``async,alone`` for the team against the solver alone only).

Every number is a median (min-max) over ``--repeats`` repetitions; ratios are paired
within a repetition. Prints one table; writes ``benchmarks/results/multi_policy.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import yaml

from astraflow.benchmarks import multi_policy_emulated, multi_policy_lora, multi_policy_resplit
from astraflow.benchmarks.job_bench import check_repetitions
from astraflow.benchmarks.lib.cli import parse_sets
from astraflow.benchmarks.lib.results import load_now, repo_path, repo_relative, write_results, write_section
from astraflow.benchmarks.lib.run_metrics import read_rows
from astraflow.benchmarks.multi_policy_alone import best_evaluated
from astraflow.benchmarks.multi_policy_arms import ARMS, one_repetition
from astraflow.benchmarks.multi_policy_emulated_arms import SEED_MAX_NEW_TOKENS
from astraflow.benchmarks.multi_policy_results import DEFINITIONS, KAFKA_ARMS, aggregate, notes, print_table
from astraflow.benchmarks.multi_policy_runs import analyse_team

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "multi_policy.json"
DEFAULT_CONFIG = ROOT / "examples" / "solver_verifier.yaml"
#: ``--arms async,alone`` (the team against the solver alone) writes this section of the default results file
TEAM_VS_ALONE, TEAM_VS_ALONE_ARMS = "team_vs_alone", ("async", "alone")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(DEFAULT_CONFIG))
    # 16: the evaluator's version-0 pass (team included) overlaps the first ~6 steps of a Kafka
    # arm on 2 cores, and the steady window starts after it
    ap.add_argument("--steps", type=int, default=16, help="iterations per arm")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of (c)")
    ap.add_argument("--alone-eval-every", type=int, default=2, help="(d) evaluates every E versions")
    ap.add_argument("--alone-eval", choices=("live", "exported"), default="live",
                    help="(d)'s evaluation: live (its evaluator, every E versions, sharing the cores with its "
                         "training) or exported (exports every E versions, evaluated after its run: for jobs "
                         "whose evaluation is slower than their training, e.g. code in the sandbox)")
    ap.add_argument("--alone-run-factor", type=float, default=1.0,
                    help="(d) runs this many times (a)'s wall-clock (> 1: long enough to reach (a)'s generated "
                         "tokens; its accuracy at equal wall-clock is read at (a)'s time either way)")
    ap.add_argument("--run-timeout", type=float, default=360.0,
                    help="seconds before a Kafka arm counts as hung (it is recorded and run again)")
    ap.add_argument("--quick", action="store_true", help="5 iterations, 1 repetition (a smoke run, not a result)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                    help="override a key of the team config in every arm (repeatable), e.g. "
                         "workflow.params.retry=fresh")
    ap.add_argument("--arms", default=",".join(ARMS),
                    help=f"the arms to run, comma-separated, of {', '.join(ARMS)} (async always runs)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--keep-run-data", action="store_true",
                    help="keep each Kafka arm's broker data, checkpoints and exports (removed once the run is "
                         "analysed: its metrics, summary, traces and logs stay)")
    ap.add_argument("--run-root", default=str(ROOT / "runs" / "bench-multi-policy"))
    ap.add_argument("--emulated", action="store_true",
                    help="Table 2 at the seed's scale on emulated accelerators (multi_policy_emulated.py): "
                         "writes multi_policy_emulated.json")
    ap.add_argument("--devices", type=int, default=8, help="--emulated: devices in all")
    ap.add_argument("--polls-in-flight", type=int, default=4,
                    help="--emulated: polls a RaaS node of (a)/(b) rolls out at once (rollout.polls_in_flight)")
    ap.add_argument("--profile", default="h100-qwen3-8b", help="--emulated: emulation profile")
    ap.add_argument("--dilation", type=float, default=0.3, help="--emulated: wall seconds per modelled second")
    ap.add_argument("--token-scale", type=int, default=256, help="--emulated: modelled tokens per generated token")
    ap.add_argument("--max-new-tokens-modelled", type=int, default=SEED_MAX_NEW_TOKENS,
                    help="--emulated: every policy's length cap in modelled tokens (the seed's 4096); its real "
                         "max_new_tokens is this / --token-scale")
    ap.add_argument("--max-staleness", type=int, default=3,
                    help="--emulated: dataflow.max_staleness of every arm; async keeps about (an episode's "
                         "latency / time per iteration) batches in flight, and the staleness bound caps that "
                         "(with --polls-in-flight: one poll per version in flight)")
    ap.add_argument("--workload", default="reasoning",
                    help="--emulated: the workload of emulation/profiles.yaml whose length spread the modelled "
                         "lengths take ('' for the tiny model's lengths, scaled)")
    ap.add_argument("--prompt-token-scale", type=int, default=16, help="--emulated: modelled tokens per prompt token")
    ap.add_argument("--eval-problems", type=int, default=50, help="--emulated: held-out problems (start and end)")
    ap.add_argument("--reprice", action="store_true",
                    help="--emulated: measure (a)/(b) again on the split re-priced from the written Table 2's own "
                         "(a) runs (its settings, its (c) repetitions paired): writes its 'repriced' section")
    ap.add_argument("--reprice-arms", default="async,lockstep", help="--reprice / --tune: the arms to measure")
    ap.add_argument("--tune", action="store_true",
                    help="--emulated: find the split by measuring (a) (a device moved to the busiest stage per round, "
                         "kept when 5%% faster), then measure (a) and (b) on it: writes its 'tuned' section")
    ap.add_argument("--tune-rounds", type=int, default=3, help="--tune: probes at most")
    ap.add_argument("--lora-arm", action="store_true",
                    help="--emulated: arm (d), both policies LoRA adapters of one base on one shared pool and one "
                         "trainer's devices, with the written Table 2's settings: writes its 'lora_shared' section")
    ap.add_argument("--lora-split", default="6,2", help="--lora-arm: devices of the shared pool and of the trainers")
    ap.add_argument("--lora-rank", type=int, default=8, help="--lora-arm: both adapters' rank (alpha 2 x rank)")
    ap.add_argument("--no-partial", action="store_true",
                    help="--emulated: skip arm (a) with partial rollouts (rollout.partial on every pool)")
    ap.add_argument("--reanalyse", metavar="JSON[:SECTION]",
                    help="measure nothing: re-read the Kafka arms' run directories named in this result (or in "
                         "its SECTION, e.g. multi_policy.json:team_vs_alone), aggregate again and rewrite it")
    args = ap.parse_args(argv)
    if args.reanalyse:
        file, _, section = args.reanalyse.partition(":")
        return reanalyse(Path(file), section or None)
    if args.emulated:
        if args.out == str(RESULTS):
            args.out = str(multi_policy_emulated.RESULTS)
        if args.steps == ap.get_default("steps"):
            args.steps = 12  # steady state: the window starts after step max_staleness + 2
        check_repetitions(ap, args, quick_steps=4)
        mode = (multi_policy_resplit.tune_main if args.tune else
                multi_policy_resplit.reprice_main if args.reprice else
                multi_policy_lora.lora_main if args.lora_arm else multi_policy_emulated.main)
        return mode(args)
    check_repetitions(ap, args, quick_steps=5)
    args.arms = {a.strip() for a in args.arms.split(",") if a.strip()} | {"async"}
    if args.arms - set(ARMS):
        ap.error(f"--arms: unknown {sorted(args.arms - set(ARMS))}; the arms are {', '.join(ARMS)}")
    args.alone_steps = 20 * args.steps  # more than (d) can train in (a)'s time: it is stopped by the clock
    base = yaml.safe_load(Path(args.config).read_text())
    args.team = Path(args.config).stem  # the results section's name (before --set rewrites the config's path)
    overrides = parse_sets(ap, args.overrides)
    if overrides:  # every arm reads the same overridden config ((c) and (d) from the file)
        base = with_overrides(base, overrides)
        Path(args.run_root).mkdir(parents=True, exist_ok=True)
        args.config = str(Path(args.run_root) / f"team-{int(time.time())}.yaml")
        Path(args.config).write_text(yaml.safe_dump(base, sort_keys=False))
    load_before = load_now()
    reps = [one_repetition(args, base, rep) for rep in range(args.repeats)]
    return finish(args, base, overrides, reps, load_before)


def finish(args, base: dict, overrides: dict, reps: list[dict], load_before: dict | None) -> int:
    """Aggregate the repetitions, print the table and write the result."""
    agg = aggregate(reps, problems=base.get("eval", {}).get("problems"))
    workflow = base.get("workflow", {}).get("name", "solver_verifier")
    print_table(agg)
    out = {"benchmark": "multi_policy", "steps": args.steps, "repeats": args.repeats, "config": repo_relative(args.config),
           "overrides": overrides, "arms": sorted(args.arms),
           "quick": args.quick, "sequential_threads": args.threads, "alone_eval_every": args.alone_eval_every,
           "alone_run_factor": args.alone_run_factor, "alone_eval": args.alone_eval,
           "workflow": workflow,
           "method": __doc__, "definitions": DEFINITIONS,
           "notes": notes(agg, args.threads, args.steps, args.alone_eval_every), **agg, "repetitions": reps}
    save(Path(args.out), args.arms, out, load_before, getattr(args, "team", workflow))
    return 0


def team_vs_alone_section(team: str) -> str:
    """The section of the default results file that holds a team against its solver alone,
    ``team`` the name of its config file (``examples/<team>.yaml``): ``team_vs_alone`` for the
    default config (``solver_verifier``), else ``team_vs_alone_<team>`` (the same workflow on
    another model, ``smollm2_solver_verifier``, is a team of its own)."""
    return TEAM_VS_ALONE if team == DEFAULT_CONFIG.stem else f"{TEAM_VS_ALONE}_{team}"


def save(path: Path, arms, out: dict, load_before: dict | None, team: str = DEFAULT_CONFIG.stem) -> Path:
    """Write a run's result. Into the default file, the team against the solver alone
    (``--arms async,alone``) is its own section, one per team config, so the speed arms' run
    beside it is kept and every accuracy number has one home; a run of other arms keeps those
    sections."""
    if path == RESULTS and set(arms) == set(TEAM_VS_ALONE_ARMS):
        return write_section(RESULTS, team_vs_alone_section(team), out, load_before, "multi_policy")
    if path == RESULTS and RESULTS.is_file():
        for key, kept in json.loads(RESULTS.read_text()).items():
            if key == TEAM_VS_ALONE or key.startswith(f"{TEAM_VS_ALONE}_"):
                out[key] = kept
    return write_results(path, out, load_before)


def with_overrides(base: dict, overrides: dict) -> dict:
    """``base`` with each dotted key set (sections made where missing)."""
    data = copy.deepcopy(base)
    for dotted, value in overrides.items():
        node = data
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return data


def reanalyse(path: Path, section: str | None = None) -> int:
    """Aggregate a written result (or its ``section``, e.g. ``team_vs_alone``) again from its
    own runs (new analysis, same measurements): the Kafka arms from their run directories'
    metrics, (c) and (d) as recorded."""
    whole = json.loads(path.read_text())
    out = whole[section] if section else whole
    reps = out["repetitions"]
    for r in reps:
        for arm in (a for a in KAFKA_ARMS if a in r):  # (a run of --arms may lack (b))
            kept = {k: r[arm][k] for k in ("load_before", "failed_attempts", "trained_groups") if k in r[arm]}
            r[arm] = {**analyse_team(Path(r[arm]["run_dir"])), **kept}
            if "trained_groups" in kept:
                r[arm]["episodes_per_trained_group"] = r[arm]["episodes"] / kept["trained_groups"]
        alone = r.get("solver_alone")
        if alone and alone.get("run_dir") and (Path(alone["run_dir"]) / "metrics.jsonl").exists():
            alone.update(best_evaluated(read_rows(Path(alone["run_dir"]))))
    config = repo_path(out["config"])
    agg = aggregate(reps, problems=yaml.safe_load(config.read_text()).get("eval", {}).get("problems")
                    if config.exists() else None)
    print_table(agg)
    out.update(agg, method=__doc__, definitions=DEFINITIONS,
               notes=notes(agg, out["sequential_threads"], out["steps"], out["alone_eval_every"]),
               reanalysed=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), repetitions=reps)
    path.write_text(json.dumps(whole, indent=2) + "\n")
    print(f"rewrote {path}")
    return 0


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, ReadmeRow, heading, load_note, fmt_spread as _sp)


REPORT_TITLE = "Multi-policy"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's sections of docs/benchmarks.md: Table 2 on the CPU and each team against its solver
    alone, from ``multi_policy.json``."""
    d = load("multi_policy")
    if not d:
        return []
    s, arms = d["s_per_iter"], d["arms"]
    out = [*heading(REPORT_TITLE),
           f"**Multi-policy** — `python -m astraflow.benchmarks.multi_policy` (solver–verifier, "
           f"{d['steps']} iterations per arm at equal samples per iteration, median (min–max) of {d['repeats']} "
           f"repetitions{load_note(d)}; an iteration = every policy one step)", "",
           "| arm | s / iteration | held-out team accuracy (this run's, the verifier before its revision 2) |",
           "|---|---:|---:|"]
    names = {"async": "(a) async multi-policy (Kafka, no barrier)", "lockstep": "(b) `barrier: lockstep`",
             "sequential": "(c) sequential single controller, one process, no Kafka"}
    for key, label in names.items():
        team = arms.get(key, {}).get("team_accuracy")
        out.append(f"| {label} | {_sp(s[key])} | {_sp(team, '.3f') if team else '–'} |")
    out += [f"| (d) the solver alone, same wall-clock as (a) | – | solver alone: "
            f"{_sp(d['solver_alone_accuracy'], '.3f')} |", "",
            f"Speed-up of (a): {_sp(d['speedup_vs_sequential'])}x vs (c), {_sp(d['speedup_vs_lockstep'])}x vs (b); "
            f"team accuracy at version 0: {_sp(d['team_accuracy_initial'], '.3f')}. "
            + (f"A verifier call over Kafka (request on `generate.verifier`, served by the verifier's pool, "
               f"reply on `replies`) costs the episode {_sp(arms['async']['remote_wait_s_per_call'], '.3f')} s "
               f"in (a), against {_sp(arms['sequential']['G_verifier_s'], '.3f')} s per iteration for every "
               f"verifier row of (c) in one engine call. "
               if "remote_wait_s_per_call" in arms.get("async", {}) and "G_verifier_s" in arms["sequential"]
               else "")
            + " ".join(d.get("notes", [])[:1]), ""]
    sections = sorted(k for k in d if k == "team_vs_alone" or k.startswith("team_vs_alone_"))
    return out + [line for k in sections for line in _team_vs_alone_rows(d[k], k)]


def _team_vs_alone_rows(t: dict | None, section: str) -> list[str]:
    """A ``team_vs_alone[_<workflow>]`` section of multi_policy.json: a team against its solver alone."""
    if not t:
        return []
    sets = " ".join(f"--set {k}={v}" for k, v in t.get("overrides", {}).items())
    config = "" if section == "team_vs_alone" else f"--config examples/{section.removeprefix('team_vs_alone_')}.yaml "
    live = "" if t.get("alone_eval", "live") == "live" else f"--alone-eval {t['alone_eval']} "
    who = "" if section == "team_vs_alone" else f" ({section.removeprefix('team_vs_alone_')})"
    out = [*heading(f"The team against the solver alone{who}"),
           f"**The team against the solver alone{who}** — `python -m astraflow.benchmarks.multi_policy {config}"
           f"--arms async,alone --steps {t['steps']} --alone-eval-every {t['alone_eval_every']} {live}"
           f"--alone-run-factor {t['alone_run_factor']:g} {sets}` (`multi_policy.json`, section `{section}`; "
           f"held-out accuracy, median (min–max) of {t['repeats']} repetitions{load_note(t)})", "",
           "| held-out accuracy | median (min–max) | team − alone | in SEs (binomial / problems only) | team ahead |",
           "|---|---:|---:|---:|---:|",
           f"| team, after {t['steps']} iterations | {_sp(t['team_accuracy'], '.3f')} | | | |"]
    rows = (("solver alone, equal generated tokens", "solver_alone_accuracy_equal_tokens", "equal_tokens"),
            ("solver alone, equal wall-clock", "solver_alone_accuracy", "equal_wall_clock"),
            ("solver alone, best version of a longer run", "solver_alone_accuracy_best_evaluated", "best_evaluated"))
    for label, key, diff in rows:
        if key not in t:
            continue
        m = t.get("team_minus_alone", {}).get(diff)
        tail = (f"{m['diff']:+.3f} ± {m['se']:.3f} | {m['in_se']:.1f} / {m['in_se_upper']:.1f} | "
                f"{m['repetitions_team_ahead']} of {m['repetitions']}" if m else "| |")
        out.append(f"| {label} | {_sp(t[key], '.3f')} | {tail} |")
    return out + [""]


def readme_row(load: Loader) -> ReadmeRow | None:
    """The README's line: s per iteration of the three arms (on 2 CPU cores the one process wins)."""
    d = load("multi_policy")
    if not d:
        return None
    s = {k: v["median"] for k, v in d["s_per_iter"].items()}
    return ReadmeRow(REPORT_TITLE, f"s / iteration, solver–verifier on the CPU, median of {d['repeats']}",
                     f"async {s['async']:.2f} · lockstep {s['lockstep']:.2f} · one process, no Kafka "
                     f"{s['sequential']:.2f}", "lower")


if __name__ == "__main__":
    raise SystemExit(main())
