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

``--set KEY=VALUE`` overrides a key of the team config in every arm (e.g.
``workflow.params.retry=fresh``, ``eval.problems=400``); ``--arms`` runs a subset (e.g.
``async,alone`` for the team against the solver alone only).

Every number is a median (min-max) over ``--repeats`` repetitions; ratios are paired
within a repetition. Prints one table; writes ``benchmarks/results/multi_policy.json``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from astraflow.benchmarks.job_bench import check_repetitions
from astraflow.benchmarks.results_io import (fmt_spread, load_now, ratio_spread, spread, write_results,
                                              write_section)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "multi_policy.json"
DEFAULT_CONFIG = ROOT / "examples" / "solver_verifier.yaml"
KAFKA_ARMS = ("async", "lockstep")
#: ``--arms async,alone`` (the team against the solver alone) writes this section of the default results file
TEAM_VS_ALONE, TEAM_VS_ALONE_ARMS = "team_vs_alone", ("async", "alone")
ARMS = ("async", "alone", "lockstep", "sequential")  #: ``--arms`` names, in the order a repetition runs them
#: seconds (d) may run past (a)'s wall-clock, so its evaluator can measure the version it had then
ALONE_GRACE_S = 15.0


# -- what each arm runs --------------------------------------------------------------------
def team_config(base: dict, barrier: str, steps: int, job: str, run_dir: str) -> dict:
    """The team job of arm (a) or (b): ``barrier``, ``steps`` iterations, evaluated at the start and end."""
    data = copy.deepcopy(base)
    data.update(job=job, barrier=barrier, run_dir=run_dir)
    data.setdefault("trainer", {})["steps"] = steps
    data.setdefault("eval", {})["every"] = 0
    return data


def solver_alone_config(base: dict, cfg, steps: int, eval_every: int, job: str, run_dir: str) -> dict:
    """Arm (d): the lead policy's sections of ``cfg`` (the loaded team job) as a one-policy
    ``rlvr`` job named after that policy; the rest of ``base`` (data, eval, seed) as it is."""
    from astraflow.config import POLICY_SECTIONS
    lead = cfg.view(cfg.lead_policy)
    data = {k: copy.deepcopy(v) for k, v in base.items() if k not in ("policies", "workflow", "barrier")}
    data.update({k: dataclasses.asdict(getattr(lead, k)) for k in POLICY_SECTIONS})
    reward = cfg.workflow.params.get("reward")
    data["workflow"] = {"name": "rlvr", "params": {"reward": reward} if reward else {}}
    data.update(job=job, policy=lead.policy, run_dir=run_dir)
    data["trainer"]["steps"] = steps
    data.setdefault("eval", {})["every"] = eval_every
    return data


def write_config(data: dict, run_root: Path) -> Path:
    """Component processes read the job's config from a file: one per arm and repetition."""
    path = run_root / f"{data['job']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# -- reading a Kafka run's metrics -----------------------------------------------------
class NoSteps(RuntimeError):
    """A run that ended without training a step (nothing to measure)."""


def trainer_steps(rows: list[dict]) -> dict[str, dict[int, float]]:
    """Per policy, step -> time its trainer reported the step (``trainer.samples``)."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["name"] == "trainer.samples" and r["component"].startswith("trainer."):
            out.setdefault(r["component"].split(".", 1)[1], {})[int(r["step"])] = float(r["ts"])
    return out


def initial_eval_end(rows: list[dict]) -> float | None:
    """When the evaluator finished its version-0 evaluation (team included), if it did."""
    ts = [float(r["ts"]) for r in rows if r["name"] in ("eval.accuracy", "eval.team_accuracy") and r["step"] == 0]
    return max(ts, default=None)


def steady_s_per_step(step_ts: dict[int, float], not_before: float | None = None) -> dict:
    """Seconds per step from the end of step 2 (or of the first step ending at or after
    ``not_before``, if later) to the end of the last step."""
    steps = sorted(step_ts)
    if len(steps) < 3:
        raise ValueError(f"{len(steps)} trained steps; steady state needs at least 3")
    first = steps[1]
    if not_before is not None:
        later = [s for s in steps[1:-1] if step_ts[s] >= not_before]
        first = later[0] if later else steps[-2]
    last = steps[-1]
    return {"s_per_step": (step_ts[last] - step_ts[first]) / (last - first), "from_step": first, "to_step": last}


def launch_ts(rows: list[dict], summary: dict) -> float:
    """When ``run_job`` started: the first trained step's time minus the summary's time to it."""
    first = min(float(r["ts"]) for r in rows if r["name"] == "trainer.train_s" and r["step"] == 1)
    return first - float(summary["time_to_first_step_s"])


def analyse_team(run_dir: Path) -> dict:
    """Arm (a) or (b): seconds per iteration, per-policy rates, start-up and the team's accuracy."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = trainer_steps(rows)
    if not steps:
        raise NoSteps(f"{run_dir}: no step trained")
    eval0 = initial_eval_end(rows)
    per = {p: steady_s_per_step(ts, eval0) for p, ts in steps.items()}
    last = max(steps, key=lambda p: steps[p][max(steps[p])])
    start = launch_ts(rows, summary)
    return {"s_per_iter": per[last]["s_per_step"], "last_policy": last, "by_policy": per,
            "steps_by_policy": {p: max(ts) for p, ts in steps.items()},
            "time_to_first_step_s": summary["time_to_first_step_s"],
            "initial_eval_s": None if eval0 is None else eval0 - start,
            "time_to_last_step_s": max(steps[p][max(steps[p])] for p in steps) - start,
            "team_accuracy": summary.get("team_accuracy_final"),
            "team_accuracy_by_version": summary.get("team_accuracy_by_version"),
            "accuracy_alone_final": summary.get("accuracy_final"), "wall_s": summary["wall_s"],
            # where the RaaS time went: every node's poll-to-commit seconds, and groups rolled out for nothing
            "raas_busy_s": sum(float(r["value"]) for r in rows if r["name"] == "raas.busy_s"),
            "groups_dropped": sum(float(r["value"]) for r in rows if r["name"].startswith("dataflow.dropped.")),
            # episodes rolled out: the lead pool's committed polls (every role of each one generated)
            "episodes": sum(float(r["value"]) for r in rows if r["name"] == "raas.tasks"),
            # what a role call over Kafka costs the episode: the lead node's running mean of the
            # wait per remote call (request out, served by the other pool, reply back), last value
            "remote_wait_s_per_call": next((float(r["value"]) for r in reversed(rows)
                                            if r["name"] == "raas.remote_wait_s_per_call"), float("nan")),
            "remote_calls": remote_calls(run_dir),
            "generated_tokens": generated_tokens(rows),
            "eval_k": _eval_k(rows), "verifier": verifier_rates(rows),
            "run_dir": str(run_dir)}


def _eval_k(rows: list[dict]) -> int | None:
    return next((int(r["label.k"]) for r in rows if r["name"] == "eval.accuracy" and "label.k" in r), None)


def verifier_rates(rows: list[dict]) -> dict:
    """The verifier on (a)'s training episodes of the run's last half (by the lead's version):
    accuracy, true-positive rate (approved / right first attempts), true-negative rate and the
    share of first attempts it rejected, from the episode metrics (means of n-sample shares,
    so the rates are ratios of means)."""
    def mean(key: str) -> float | None:
        vals = [(int(r["step"]), float(r["value"])) for r in rows if r["name"] == f"raas.episode.{key}"]
        if not vals:
            return None
        half = max(s for s, _ in vals) / 2
        late = [v for s, v in vals if s >= half]
        return sum(late) / len(late)
    acc, first, app, rej = (mean(k) for k in ("verifier_accuracy", "first_accuracy", "approved_correct",
                                               "rejected_wrong"))
    out = {"accuracy": acc, "first_accuracy": first, "retries": mean("retries")}
    if None not in (first, app, rej):
        out["tpr"] = app / first if first else None
        out["tnr"] = rej / (1 - first) if first < 1 else None
    return out


def binomial_se(p: float, problems: int, k: int) -> float:
    """Standard error of a mean of ``problems`` x ``k`` 0/1 samples (as if independent)."""
    return (p * (1 - p) / (problems * k)) ** 0.5


def _span_s(span: dict) -> float:
    from datetime import datetime
    at = lambda k: datetime.fromisoformat(span[k].replace("Z", "+00:00")).timestamp()  # noqa: E731
    return at("end_time") - at("start_time")


def remote_calls(run_dir: Path) -> dict:
    """What a role served by another policy's pool costs, from the run's own traces: every
    ``raas.generate`` span of a remote role (request out, served, reply back; wall seconds),
    its median and p95, and remote calls per episode (``raas.workflow`` spans)."""
    durations: list[float] = []
    episodes = 0
    for f in sorted((run_dir / "traces").glob("raas-*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                span = json.loads(line)
            except ValueError:
                continue  # a span cut off by a stopped node
            if span.get("name") == "raas.workflow":
                episodes += 1
            elif span.get("name") == "raas.generate" and span.get("attributes", {}).get("remote"):
                durations.append(_span_s(span))
    if not durations:
        return {"calls": 0, "episodes": episodes}
    durations.sort()
    return {"calls": len(durations), "episodes": episodes, "median_s": statistics.median(durations),
            "p95_s": durations[min(len(durations) - 1, int(0.95 * len(durations)))],
            "hops_per_episode": len(durations) / episodes if episodes else float("nan")}


def generated_tokens(rows: list[dict]) -> float:
    """What a run's pools generated in all (``raas.generated_tokens``: every role's own tokens)."""
    return sum(float(r["value"]) for r in rows if r["name"] == "raas.generated_tokens")


def time_of_tokens(rows: list[dict], tokens: float) -> float | None:
    """When the run's pool had generated ``tokens`` (``raas.generated_tokens``, summed in time
    order); ``None`` if it never did."""
    total = 0.0
    for r in sorted((r for r in rows if r["name"] == "raas.generated_tokens"), key=lambda r: float(r["ts"])):
        total += float(r["value"])
        if total >= tokens:
            return float(r["ts"])
    return None


def best_evaluated(rows: list[dict]) -> dict:
    """(d)'s best held-out accuracy at any version it evaluated in its whole run (which runs
    ``--alone-run-factor`` times (a)'s wall-clock): a bound in the solver alone's favour, since
    the evaluator of a loaded box lags the trainer and the version read at (a)'s time or
    tokens is the newest one evaluated by then."""
    evals = {int(r["step"]): float(r["value"]) for r in rows if r["name"] == "eval.accuracy"}
    v = max(evals, key=lambda k: (evals[k], k))
    return {"accuracy_best_evaluated": evals[v], "version_best_evaluated": v}


def lead_steps(rows: list[dict]) -> dict[int, float]:
    """The (first) trainer's version -> the time it was trained."""
    return next(iter(trainer_steps(rows).values()), {})


def version_reached(steps: dict[int, float], start: float, seconds: float) -> int:
    """The newest of ``steps`` (:func:`lead_steps`) trained within ``seconds`` of ``start`` (0: none)."""
    return max((s for s, ts in steps.items() if ts - start <= seconds), default=0)


def accuracy_at(rows: list[dict], start: float, seconds: float) -> dict:
    """The held-out accuracy of the newest evaluated version trained within ``seconds`` of ``start``."""
    steps = lead_steps(rows)
    reached = version_reached(steps, start, seconds)
    evals = {int(r["step"]): float(r["value"]) for r in rows if r["name"] == "eval.accuracy"}
    measured = [v for v in evals if v <= reached]
    if not measured:
        raise ValueError(f"no version up to {reached} was evaluated (evaluated: {sorted(evals)})")
    v = max(measured)
    return {"accuracy": evals[v], "version_reached": reached, "version_evaluated": v,
            "steps_trained": max(steps, default=0)}


# -- running the arms ------------------------------------------------------------------
#: tries per Kafka arm: a run that fails or hangs past ``--run-timeout`` is recorded and run again
ATTEMPTS = 2


def run_attempts(arm: str, rep: int, run_once) -> dict:
    """``run_once(job) -> result`` until one try succeeds; failed tries are kept in the result."""
    from astraflow.topology.processes import RunFailed
    failed = []
    for attempt in range(1, ATTEMPTS + 1):
        job = f"bench-mp-{arm}-{int(time.time())}-{rep}-{attempt}"
        try:
            return {**run_once(job), "failed_attempts": failed}
        except (RunFailed, NoSteps) as e:
            print(f"    {arm} try {attempt} failed: {e}", flush=True)
            failed.append({"job": job, "cause": str(e)})
    raise RuntimeError(f"arm {arm} of repetition {rep + 1} failed {ATTEMPTS} times: {failed}")


def run_team(base: dict, barrier: str, args, rep: int) -> dict:
    from astraflow.config import load_config
    from astraflow.launcher import run_job

    def once(job: str) -> dict:
        path = write_config(team_config(base, barrier, args.steps, job, str(args.run_root)), Path(args.run_root))
        run_dir = Path(args.run_root) / job
        load = load_now()
        cfg = load_config(path)
        run_job(cfg, run_dir=run_dir, progress=False, timeout_s=args.run_timeout)
        return with_trained_groups({**analyse_team(run_dir), "load_before": load["loadavg"]}, cfg)
    return run_attempts(barrier, rep, once)


def with_trained_groups(result: dict, cfg) -> dict:
    """Add the fresh groups each policy trained (steps x groups per batch; the lead's) and the
    episodes rolled out per trained group (1.0: no episode's roles were rolled out for nothing)."""
    lead = cfg.view(cfg.lead_policy)
    trained = lead.trainer.steps * lead.dataflow.groups_per_batch
    return {**result, "trained_groups": trained, "episodes_per_trained_group": result["episodes"] / trained}


def run_solver_alone(base: dict, args, rep: int, seconds: float, tokens: float | None = None) -> dict:
    """Arm (d) for ``seconds`` of wall-clock (plus a grace for its evaluator), then stopped; with
    ``tokens`` (what (a) generated), also its accuracy when it had generated as many."""
    from astraflow.config import load_config
    from astraflow.launcher import run_job
    from astraflow.topology.processes import RunFailed
    limit_s = seconds * args.alone_run_factor + ALONE_GRACE_S  # (its evaluator may lag its training)

    def once(job: str) -> dict:
        exported = args.alone_eval == "exported"
        data = solver_alone_config(base, load_config(args.config), args.alone_steps,
                                   0 if exported else args.alone_eval_every, job, str(args.run_root))
        if exported:  # evaluated after the run, from these exports (version 0 live, as the team's)
            data["trainer"]["export_every"] = args.alone_eval_every
        path = write_config(data, Path(args.run_root))
        run_dir = Path(args.run_root) / job
        load = load_now()
        stopped = False
        try:
            run_job(load_config(path), run_dir=run_dir, progress=False, timeout_s=limit_s)
        except RunFailed as e:
            if "timeout" not in str(e):
                raise
            stopped = True
        if not trainer_steps(_rows(run_dir)):
            raise NoSteps(f"{run_dir}: no step trained in {limit_s:.0f} s")
        return {**analyse_alone(run_dir, path, args.alone_eval, seconds, tokens), "stopped_at_timeout": stopped,
                "load_before": load["loadavg"]}
    return run_attempts("alone", rep, once)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def analyse_alone(run_dir: Path, config: Path, eval_mode: str, seconds: float, tokens: float | None = None) -> dict:
    """(d)'s accuracies from its finished run ``run_dir`` (job config ``config``): at ``seconds``
    from its launch and, with ``tokens``, when it had generated as many. ``eval_mode``
    ``exported``: the versions read are evaluated here first (:func:`evaluate_exported`), and
    version 0 too where its evaluator had not finished it when the run was stopped."""
    rows = _rows(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    start = launch_ts(rows, summary)
    initial = summary["accuracy_initial"]
    when = time_of_tokens(rows, tokens) if tokens else None  # (d) had generated (a)'s tokens
    if eval_mode == "exported":
        from astraflow.config import load_config
        policy = load_config(config).policy
        marks = [seconds] + ([when - start] if when is not None else [])
        versions = exported_needed(rows, start, marks, exported_versions(run_dir, policy))
        rows = [r for r in rows if r["name"] != "eval.accuracy" or int(r["step"]) == 0]
        if initial is None:  # its evaluator was stopped with the run before version 0 was done
            versions = [0, *versions]
        rows += evaluate_exported(config, run_dir, versions)
        if initial is None:
            initial = next(r["value"] for r in rows if r.get("exported") and r["step"] == 0)
    at = accuracy_at(rows, start, seconds)
    out = {**at, "seconds": seconds, **best_evaluated(rows), "accuracy_initial": initial,
           "generated_tokens": generated_tokens(rows), "eval_k": _eval_k(rows), "run_dir": str(run_dir),
           "eval_mode": eval_mode}
    if tokens:
        out["equal_tokens"] = ({"tokens": tokens, "reached": False} if when is None else
                               {"tokens": tokens, "reached": True, "seconds": when - start,
                                **accuracy_at(rows, start, when - start)})
    return out


def run_sequential(config: Path, steps: int, threads: int) -> dict:
    """Arm (c) as its own Python process (nothing shared with this one)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "sequential.json"
        cmd = [sys.executable, "-m", "astraflow.benchmarks.sequential_multi", "--config", str(config),
               "--steps", str(steps), "--threads", str(threads), "--out", str(out)]
        load = load_now()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"sequential baseline failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        r = json.loads(out.read_text())
    r["time_to_last_step_s"] = r["setup_s"] + r["loop_s"]
    r["load_before"] = load["loadavg"]
    return r


def exported_versions(run_dir: Path, policy: str) -> list[int]:
    """The versions a run exported as Hugging Face directories (``hf/<policy>/v<k>``)."""
    root = run_dir / "hf" / policy
    return sorted(int(d.name[1:]) for d in root.glob("v*") if d.name[1:].isdigit()) if root.is_dir() else []


def evaluate_exported(config: Path, run_dir: Path, versions: list[int]) -> list[dict]:
    """Held-out accuracy of each of ``versions`` of the job's policy, from its exports, by the
    evaluator's own function (same problems, k, temperature, reward and sandbox), in this
    process after the run: nothing else shares the cores, so an evaluation slower than
    training (code in the sandbox) measures the very versions the comparisons read. Rows as
    the evaluator's ``eval.accuracy`` metrics (``step``: the version)."""
    from transformers import AutoTokenizer

    from astraflow.actors.common import configure_sandbox, make_rollout_engine, model_path, set_threads
    from astraflow.actors.evaluator import heldout_accuracy, heldout_problems
    from astraflow.config import load_config
    cfg = load_config(config)
    configure_sandbox(cfg)
    set_threads(cfg.eval.threads)
    problems = heldout_problems(cfg)
    rows = []
    for v in versions:
        # version 0: the job's own model (what the trainer started from)
        path = model_path(cfg) if v == 0 else run_dir / "hf" / cfg.policy / f"v{v}"
        t0 = time.perf_counter()
        engine = make_rollout_engine(cfg, path, kind="cpu", name=f"bench-eval-v{v}")
        acc = heldout_accuracy(cfg, engine, AutoTokenizer.from_pretrained(str(path)), problems)
        print(f"    (d) v{v}: held-out accuracy {acc:.3f} ({len(problems)} problems x {cfg.eval.k}, "
              f"{time.perf_counter() - t0:.0f} s after the run)", flush=True)
        rows.append({"ts": time.time(), "component": f"bench.eval.{cfg.policy}", "name": "eval.accuracy",
                     "value": acc, "step": v, "exported": True, "label.k": cfg.eval.k})
    return rows


def exported_needed(rows: list[dict], start: float, marks: list[float], exported: list[int]) -> list[int]:
    """The exported versions the comparisons read: per mark (seconds from ``start``), the newest
    export at or below the version trained by then; and the newest export of all (for the best
    evaluated)."""
    steps, need = lead_steps(rows), set()
    for seconds in marks:
        reached = version_reached(steps, start, seconds)
        below = [v for v in exported if 0 < v <= reached]
        if below:
            need.add(max(below))
    if exported:
        need.add(max(exported))
    return sorted(need)


def one_repetition(args, base: dict, rep: int) -> dict:
    out: dict = {}
    print(f"--- repetition {rep + 1}: (a) async", flush=True)
    out["async"] = run_team(base, "async", args, rep)
    if "alone" in args.arms:
        a = out["async"]
        print(f"--- repetition {rep + 1}: (d) solver alone for {a['time_to_last_step_s']:.0f} s", flush=True)
        out["solver_alone"] = run_solver_alone(base, args, rep, a["time_to_last_step_s"], a["generated_tokens"])
    if "lockstep" in args.arms:
        print(f"--- repetition {rep + 1}: (b) lockstep", flush=True)
        out["lockstep"] = run_team(base, "lockstep", args, rep)
    if "sequential" in args.arms:
        print(f"--- repetition {rep + 1}: (c) sequential ({args.threads} thread(s))", flush=True)
        out["sequential"] = run_sequential(Path(args.config), args.steps, args.threads)
    return out


# -- results ---------------------------------------------------------------------------
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


def standard_errors(reps: list[dict], problems: int) -> dict:
    """Per repetition: the team's and the solver alone's held-out accuracies, each with its
    binomial SE over problems x k, and the difference team - alone in SEs of the difference."""
    out = []
    for r in reps:
        a, d = r["async"], r["solver_alone"]
        k = a.get("eval_k") or d.get("eval_k") or 1

        def with_se(p: float) -> dict:  # se_upper: as if the k samples of a problem were all alike
            return {"accuracy": p, "se": binomial_se(p, problems, k), "se_upper": binomial_se(p, problems, 1)}
        team = with_se(a["team_accuracy"])
        row = {"problems": problems, "k": k, "team": team, "team_initial": with_se(a["team_accuracy_by_version"]["0"]),
               "alone_initial": with_se(d["accuracy_initial"]), "alone_equal_wall_clock": with_se(d["accuracy"])}
        eq = d.get("equal_tokens")
        if eq and eq["reached"]:
            row["alone_equal_tokens"] = with_se(eq["accuracy"])
        if "accuracy_best_evaluated" in d:
            row["alone_best_evaluated"] = with_se(d["accuracy_best_evaluated"])
        for key in ("alone_equal_wall_clock", "alone_equal_tokens", "alone_best_evaluated"):
            if key in row:
                diff = team["accuracy"] - row[key]["accuracy"]
                se = (team["se"] ** 2 + row[key]["se"] ** 2) ** 0.5
                upper = (team["se_upper"] ** 2 + row[key]["se_upper"] ** 2) ** 0.5
                row[f"team_minus_{key.removeprefix('alone_')}"] = {"diff": diff, "se": se, "se_upper": upper,
                                                                   "in_se": diff / se if se else None}
        out.append(row)
    return {"by_repetition": out}


#: team_minus_alone's comparisons, in words
COMPARISONS = {"equal_wall_clock": "at equal wall-clock", "equal_tokens": "at equal tokens",
               "best_evaluated": "at its best evaluated version of its whole run"}


def pooled_accuracies(rows: list[dict], agg: dict) -> dict:
    """The headline keys, each with its standard error, from the per-repetition rows (the one
    source of every SE here): ``team_accuracy`` (and ``team_accuracy_equal_tokens``, the same
    measurement: the team is read at its end and the solver alone at the team's wall-clock or
    tokens), ``solver_alone_accuracy`` and ``solver_alone_accuracy_equal_tokens`` get ``mean``
    (over repetitions) and ``se`` / ``se_upper`` of that mean (``sqrt(sum se_i^2) / R``); and
    ``team_minus_alone`` per comparison: the mean difference, its SEs and the difference in
    SEs (``in_se`` binomial, ``in_se_upper`` counting problems only)."""
    def pool(key: str) -> dict:
        got = [r[key] for r in rows]
        n = len(got)
        return {"mean": sum(g["accuracy"] for g in got) / n,
                "se": sum(g["se"] ** 2 for g in got) ** 0.5 / n,
                "se_upper": sum(g["se_upper"] ** 2 for g in got) ** 0.5 / n}

    out: dict = {"team_accuracy": {**agg["team_accuracy"], **pool("team")},
                 "solver_alone_accuracy": {**agg["solver_alone_accuracy"], **pool("alone_equal_wall_clock")}}
    diffs: dict = {}
    for key in ("equal_wall_clock", "equal_tokens", "best_evaluated"):
        if not all(f"team_minus_{key}" in r for r in rows):
            continue
        got = [r[f"team_minus_{key}"] for r in rows]
        n = len(got)
        d = sum(g["diff"] for g in got) / n
        se = sum(g["se"] ** 2 for g in got) ** 0.5 / n
        upper = sum(g["se_upper"] ** 2 for g in got) ** 0.5 / n
        diffs[key] = {"diff": d, "se": se, "se_upper": upper, "in_se": d / se if se else None,
                      "in_se_upper": d / upper if upper else None,
                      "repetitions_team_ahead": sum(g["diff"] > 0 for g in got), "repetitions": n}
    if "equal_tokens" in diffs:
        out["team_accuracy_equal_tokens"] = out["team_accuracy"]
        out["solver_alone_accuracy_equal_tokens"] = {**agg["solver_alone_accuracy_equal_tokens"],
                                                     **pool("alone_equal_tokens")}
    out["team_minus_alone"] = diffs
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
    print(hdr)
    print("-" * len(hdr))
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


def main(argv: list[str] | None = None) -> int:
    import os
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
    ap.add_argument("--max-new-tokens-modelled", type=int, default=4096,
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
    ap.add_argument("--reanalyse", metavar="JSON[:SECTION]",
                    help="measure nothing: re-read the Kafka arms' run directories named in this result (or in "
                         "its SECTION, e.g. multi_policy.json:team_vs_alone), aggregate again and rewrite it")
    args = ap.parse_args(argv)
    if args.reanalyse:
        file, _, section = args.reanalyse.partition(":")
        return reanalyse(Path(file), section or None)
    if args.emulated:
        from astraflow.benchmarks import multi_policy_emulated
        if args.out == str(RESULTS):
            args.out = str(multi_policy_emulated.RESULTS)
        if args.steps == ap.get_default("steps"):
            args.steps = 12  # steady state: the window starts after step max_staleness + 2
        check_repetitions(ap, args, quick_steps=4)
        mode = (multi_policy_emulated.tune_main if args.tune else
                multi_policy_emulated.reprice_main if args.reprice else multi_policy_emulated.main)
        return mode(args)
    check_repetitions(ap, args, quick_steps=5)
    args.arms = {a.strip() for a in args.arms.split(",") if a.strip()} | {"async"}
    if args.arms - set(ARMS):
        ap.error(f"--arms: unknown {sorted(args.arms - set(ARMS))}; the arms are {', '.join(ARMS)}")
    args.alone_steps = 20 * args.steps  # more than (d) can train in (a)'s time: it is stopped by the clock
    base = yaml.safe_load(Path(args.config).read_text())
    overrides = parse_overrides(ap, args.overrides)
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
    out = {"benchmark": "multi_policy", "steps": args.steps, "repeats": args.repeats, "config": args.config,
           "overrides": overrides, "arms": sorted(args.arms),
           "quick": args.quick, "sequential_threads": args.threads, "alone_eval_every": args.alone_eval_every,
           "alone_run_factor": args.alone_run_factor, "alone_eval": args.alone_eval,
           "workflow": workflow,
           "method": __doc__, "definitions": DEFINITIONS,
           "notes": notes(agg, args.threads, args.steps, args.alone_eval_every), **agg, "repetitions": reps}
    save(Path(args.out), args.arms, out, load_before, workflow)
    return 0


def team_vs_alone_section(workflow: str) -> str:
    """The section of the default results file that holds ``workflow``'s team against its
    solver alone: ``team_vs_alone`` for the solver-verifier (the default config), else
    ``team_vs_alone_<workflow>``."""
    return TEAM_VS_ALONE if workflow == "solver_verifier" else f"{TEAM_VS_ALONE}_{workflow}"


def save(path: Path, arms, out: dict, load_before: dict | None, workflow: str = "solver_verifier") -> Path:
    """Write a run's result. Into the default file, the team against the solver alone
    (``--arms async,alone``) is its own section, one per workflow, so the speed arms' run
    beside it is kept and every accuracy number has one home; a run of other arms keeps those
    sections."""
    if path == RESULTS and set(arms) == set(TEAM_VS_ALONE_ARMS):
        return write_section(RESULTS, team_vs_alone_section(workflow), out, load_before, "multi_policy")
    if path == RESULTS and RESULTS.is_file():
        for key, kept in json.loads(RESULTS.read_text()).items():
            if key == TEAM_VS_ALONE or key.startswith(f"{TEAM_VS_ALONE}_"):
                out[key] = kept
    return write_results(path, out, load_before)


def parse_overrides(ap: argparse.ArgumentParser, pairs: list[str]) -> dict:
    """``KEY=VALUE`` pairs (the value as YAML) as dotted key -> value."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            ap.error(f"--set expects KEY=VALUE, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


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
            rows = [json.loads(line) for line in (Path(alone["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
            alone.update(best_evaluated(rows))
    agg = aggregate(reps, problems=yaml.safe_load(Path(out["config"]).read_text()).get("eval", {}).get("problems")
                    if Path(out["config"]).exists() else None)
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
