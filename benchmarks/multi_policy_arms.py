"""The arms of ``multi_policy``: each arm's job config, and running it once in a repetition.

(a) async and (b) lockstep are the team job through ``run_job``; (c) sequential is
``sequential_multi`` as its own process; (d) the solver alone is a one-policy ``rlvr`` job
stopped at (a)'s wall-clock. A Kafka arm that fails or hangs is recorded and run again.
Knows how to launch the arms; reading their runs is :mod:`.multi_policy_runs` and
:mod:`.multi_policy_alone`, comparing them :mod:`.multi_policy_results`.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path

import yaml

from astraflow.benchmarks.lib.child import run_child
from astraflow.benchmarks.lib.job_runs import prune_run_dir
from astraflow.benchmarks.lib.results import load_now
from astraflow.benchmarks.lib.run_metrics import read_rows, trainer_steps
from astraflow.benchmarks.multi_policy_alone import analyse_alone
from astraflow.benchmarks.multi_policy_runs import NoSteps, analyse_team, with_trained_groups
from astraflow.topology.processes import RunFailed


ARMS = ("async", "alone", "lockstep", "sequential")  #: ``--arms`` names, in the order a repetition runs them

#: seconds (d) may run past (a)'s wall-clock, so its evaluator can measure the version it had then
ALONE_GRACE_S = 15.0


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
    from astraflow.config import POLICY_SECTIONS  # the job machinery (~1 s to import): only when (d) runs
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


#: tries per Kafka arm: a run that fails or hangs past ``--run-timeout`` is recorded and run again
ATTEMPTS = 2


def run_attempts(arm: str, rep: int, run_once) -> dict:
    """``run_once(job) -> result`` until one try succeeds; failed tries are kept in the result."""
    failed = []
    for attempt in range(1, ATTEMPTS + 1):
        job = f"bench-mp-{arm}-{int(time.time())}-{rep}-{attempt}"
        try:
            return {**run_once(job), "failed_attempts": failed}
        except (RunFailed, NoSteps) as e:
            print(f"    {arm} try {attempt} failed: {e}", flush=True)
            failed.append({"job": job, "cause": str(e)})
    raise RuntimeError(f"arm {arm} of repetition {rep + 1} failed {ATTEMPTS} times: {failed}")


def pruned(result: dict, run_dir: Path, args) -> dict:
    """``result`` of an analysed run, its run dir's heavy parts removed unless ``--keep-run-data``
    (a SmolLM2 team's repetition writes ~10 GB)."""
    if not args.keep_run_data:
        result["pruned_bytes"] = prune_run_dir(run_dir)
    return result


def run_team(base: dict, barrier: str, args, rep: int) -> dict:
    from astraflow.config import load_config  # the job machinery (~1 s to import): only when an arm runs
    from astraflow.launcher import run_job

    def once(job: str) -> dict:
        path = write_config(team_config(base, barrier, args.steps, job, str(args.run_root)), Path(args.run_root))
        run_dir = Path(args.run_root) / job
        load = load_now()
        cfg = load_config(path)
        run_job(cfg, run_dir=run_dir, progress=False, timeout_s=args.run_timeout)
        result = with_trained_groups({**analyse_team(run_dir), "load_before": load["loadavg"]}, cfg)
        return pruned(result, run_dir, args)
    return run_attempts(barrier, rep, once)


def run_solver_alone(base: dict, args, rep: int, seconds: float, tokens: float | None = None) -> dict:
    """Arm (d) for ``seconds`` of wall-clock (plus a grace for its evaluator), then stopped; with
    ``tokens`` (what (a) generated), also its accuracy when it had generated as many."""
    from astraflow.config import load_config  # the job machinery (~1 s to import): only when an arm runs
    from astraflow.launcher import run_job
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
        if not trainer_steps(read_rows(run_dir)):
            raise NoSteps(f"{run_dir}: no step trained in {limit_s:.0f} s")
        result = {**analyse_alone(run_dir, path, args.alone_eval, seconds, tokens), "stopped_at_timeout": stopped,
                  "load_before": load["loadavg"]}
        return pruned(result, run_dir, args)
    return run_attempts("alone", rep, once)


def run_sequential(config: Path, steps: int, threads: int) -> dict:
    """Arm (c) as its own Python process (nothing shared with this one)."""
    load = load_now()
    r = run_child("astraflow.benchmarks.sequential_multi",
                  ["--config", str(config), "--steps", str(steps), "--threads", str(threads)], "sequential baseline")
    r["time_to_last_step_s"] = r["setup_s"] + r["loop_s"]
    r["load_before"] = load["loadavg"]
    return r


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
