"""How long a SIGKILL of the trainer stalls training, and where the restarted trainer's time goes.

The demo job (``examples/arithmetic_grpo.yaml``, shortened, ``eval.every 0``) runs as its real
component processes under the chaos runner (:class:`~astraflow.chaos.runner.ChaosRun`, one
broker), whose supervisor restarts a dead component after its default ``restart.delay_s``
(2 s), as a process manager would. The trainer is SIGKILLed ``--kills`` times in one run (3 by
default), each two steps past a checkpoint (``checkpoint_every`` 5: at steps 7, 17, 27 of
32), so every restart loads a checkpoint and trains again the two batches the killed process
had trained since.

For each kill, read from the run's ``metrics`` topic (``metrics.jsonl``) and the runner's
report (``chaos_report.json``, the kill's time):

- ``next_batch_after_kill_s``: from the SIGKILL (the runner's clock, when it sent the signal)
  to the first step the restarted trainer reports trained (the ``ts`` of its first
  ``trainer.samples`` metric after the kill, sent once the step's optimizer update is done);
  the batch it trains is already on ``batches.<policy>``, so this is the trainer's restart;
- ``new_step_after_kill_s``: until the trainer reports a step above the highest one trained
  before the kill (training moves past where it was);
- the breakdown of ``next_batch_after_kill_s``, which adds up to it: ``restart_wait`` (the
  kill to the new process's start: the supervisor's delay), then the restarted trainer's own
  ``trainer.start.<phase>_s`` metrics (:meth:`~astraflow.actors.trainer.TrainerActor._report_startup`:
  ``python`` interpreter and imports before the actor's setup, ``torch_import``, the engine's
  DeepSpeed and transformers imports, process group, model load and ``deepspeed.initialize``,
  ``checkpoint_load``, the Kafka ``clients``, the weight ``publisher``), then ``first_step``
  (setup done to the first step's metric: waiting for the batch and training it).

Prints one table and writes ``benchmarks/results/trainer_loss.json`` (``--out``); the
conservation audit of the run (samples lost, duplicates trained) comes with it. ``--quick``:
one kill in an 8-step job (a smoke run, not a result). ``--collect RUN_DIR`` reads a finished
run instead of running one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

from astraflow.benchmarks.lib.cli import parse_sets
from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.run_metrics import read_rows
from astraflow.benchmarks.lib.stats import fmt_spread, spread
from astraflow.benchmarks.report_format import Loader, heading, load_note

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "trainer_loss.json"
RESTART_DELAY_S = 2.0  #: the chaos runner's default (chaos.scenario.Restart)
#: the job's shortening: few problems, no evaluation, a checkpoint every 5 steps
JOB = {"eval.every": 0, "trainer.checkpoint_every": 5}
#: the restarted trainer's start-up phases, in the order they run (``trainer.start.<phase>_s``)
PHASES = ("python", "torch_import", "engine_imports", "engine_other", "engine_process_group", "engine_model_load",
          "engine_deepspeed_initialize", "checkpoint_load", "clients", "publisher")
BREAKDOWN = ("restart_wait", *PHASES, "first_step")


def kill_steps(kills: int, checkpoint_every: int) -> list[int]:
    """Two steps past every other checkpoint: each restart loads one and retrains two batches."""
    return [checkpoint_every * (2 * i + 1) + 2 for i in range(kills)]


def scenario(config: Path, steps: int, kills: list[int], sets: dict, seed: int) -> dict:
    """The chaos scenario: the job, shortened, and a SIGKILL of the trainer at each of ``kills``."""
    return {"job": {"config": str(config.resolve()), "set": {"trainer.steps": steps, **JOB, **sets}},
            "seed": seed, "timeout_s": 1800, "settle_s": 120,
            "restart": {"delay_s": RESTART_DELAY_S, "max": 5},
            "faults": [{"at_step": k, "kind": "sigkill", "target": "trainer"} for k in kills]}


# -- the analysis (of a recorded run: its metric rows and its report's faults) -------------------

def analyse(rows: list[dict], faults: list[dict]) -> list[dict]:
    """One row per SIGKILL of the trainer in ``faults``: its times and breakdown (module docstring)."""
    trainer = [r for r in rows if str(r["component"]).startswith("trainer.")]
    samples = sorted((float(r["ts"]), int(r["step"])) for r in trainer if r["name"] == "trainer.samples")
    starts = sorted((float(r["ts"]), r["name"].removeprefix("trainer.start.").removesuffix("_s"), float(r["value"]))
                    for r in trainer if r["name"].startswith("trainer.start."))
    kills = sorted(float(f["started"]) for f in faults if f["kind"] == "sigkill" and f["target"] == "trainer")
    out = []
    for k, until in zip(kills, kills[1:] + [float("inf")]):
        head = max((s for ts, s in samples if ts < k), default=0)
        first = next(((ts, s) for ts, s in samples if k <= ts < until), None)
        new = next((ts for ts, s in samples if k <= ts < until and s > head), None)
        mine = [(ts, name, v) for ts, name, v in starts if k <= ts < until]
        row: dict = {"killed_at_step": head, "next_step": None if first is None else first[1],
                     "next_batch_after_kill_s": None if first is None else first[0] - k,
                     "new_step_after_kill_s": None if new is None else new - k}
        if first is not None and mine:
            ready = mine[0][0]  # the start-up metrics are sent together, once setup is done
            phases = {name: v for ts, name, v in mine if ts - ready < 5.0}
            total = phases.pop("total", sum(phases.get(p, 0.0) for p in PHASES))
            row["breakdown_s"] = {"restart_wait": max(0.0, ready - total - k),
                                  **{p: phases.get(p, 0.0) for p in PHASES},
                                  "first_step": first[0] - ready}
            row["unaccounted_s"] = row["next_batch_after_kill_s"] - sum(row["breakdown_s"].values())
        out.append(row)
    return out


def aggregate(kills: list[dict]) -> dict:
    """``next_batch_after_kill_s`` and ``new_step_after_kill_s`` as spreads over the kills, and each
    breakdown phase's spread (kills the restarted trainer never stepped after are counted apart)."""
    done = [k for k in kills if k["next_batch_after_kill_s"] is not None and "breakdown_s" in k]
    if not done:
        raise RuntimeError(f"no kill was followed by a trained step: {kills}")
    new = [k["new_step_after_kill_s"] for k in done if k["new_step_after_kill_s"] is not None]
    return {"next_batch_after_kill_s": spread([k["next_batch_after_kill_s"] for k in done]),
            "new_step_after_kill_s": spread(new) if new else None,
            "breakdown_s": {p: spread([k["breakdown_s"][p] for k in done]) for p in BREAKDOWN},
            "kills_measured": len(done), "kills_not_recovered": len(kills) - len(done)}


def print_table(agg: dict, report: dict | None) -> None:
    hdr = f"{'trainer SIGKILL → ... (s)':<34} {'median (min–max)':>22}"
    print(f"\ntrainer SIGKILLs: {agg['kills_measured']} measured; seconds, median (min–max)")
    print(hdr)
    print("-" * len(hdr))
    print(f"{'next trained step':<34} {fmt_spread(agg['next_batch_after_kill_s'], '.1f'):>22}")
    if agg["new_step_after_kill_s"]:
        print(f"{'a step past the pre-kill head':<34} {fmt_spread(agg['new_step_after_kill_s'], '.1f'):>22}")
    for p in BREAKDOWN:
        print(f"{'  ' + p:<34} {fmt_spread(agg['breakdown_s'][p], '.2f'):>22}")
    if report:
        print(f"audit {'ok' if report['audit']['ok'] else 'FAILED'}: samples lost {report['samples_lost']}, "
              f"duplicates trained {report['duplicates_trained']}; run {'ok' if report['ok'] else 'NOT ok'}")


# -- the run -------------------------------------------------------------------------------------

def run_once(args: argparse.Namespace, sets: dict) -> Path:
    """One chaos run of the scenario; its run dir (with ``chaos_report.json`` and ``metrics.jsonl``)."""
    from astraflow.chaos.runner import ChaosRun  # the job machinery (torch-free, ~1 s): only to run
    from astraflow.chaos.scenario import load_scenario
    kills = kill_steps(args.kills, args.checkpoint_every)
    steps = kills[-1] + args.checkpoint_every
    sc = scenario(Path(args.config), steps, kills, {"trainer.checkpoint_every": args.checkpoint_every,
                                                    "seed": args.seed, "data.seed": args.seed, **sets}, args.seed)
    run_dir = Path(args.run_root) / f"trainer-loss-s{args.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "scenario.yaml"
    path.write_text(yaml.safe_dump(sc, sort_keys=False))
    print(f"--- {args.kills} trainer SIGKILL(s) at steps {kills} of {steps}; run dir {run_dir}", flush=True)
    ChaosRun(load_scenario(path), run_dir=run_dir, progress=True).run()
    return run_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "arithmetic_grpo.yaml"))
    ap.add_argument("--kills", type=int, default=3, help="trainer SIGKILLs in the run (default 3)")
    ap.add_argument("--checkpoint-every", type=int, default=JOB["trainer.checkpoint_every"])
    ap.add_argument("--seed", type=int, default=0, help="the job's and the scenario's seed")
    ap.add_argument("--quick", action="store_true", help="one kill in an 8-step job (a smoke run, not a result)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a job-config override")
    ap.add_argument("--run-root", default=str(Path(tempfile.gettempdir()) / "astraflow-trainer-loss"))
    ap.add_argument("--collect", type=Path, metavar="RUN_DIR", help="read this finished run; run nothing")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.quick:
        args.kills, args.checkpoint_every = 1, 3
    elif args.kills < 3:
        ap.error("--kills must be >= 3 (the table shows median and spread); --quick for a smoke run")
    if args.checkpoint_every < 1:
        ap.error("--checkpoint-every must be >= 1")
    sets = parse_sets(ap, args.set)
    load = load_now()
    t0 = time.monotonic()
    run_dir = args.collect or run_once(args, sets)
    report = json.loads((run_dir / "chaos_report.json").read_text())
    kills = analyse(read_rows(run_dir), report["faults"])
    agg = aggregate(kills)
    print_table(agg, report)
    write_results(args.out, {
        "benchmark": "trainer_loss", "quick": args.quick, "config": args.config, "seed": args.seed,
        "method": {"kills_per_run": args.kills, "kill_steps": kill_steps(args.kills, args.checkpoint_every),
                   "checkpoint_every": args.checkpoint_every, "restart_delay_s": RESTART_DELAY_S,
                   "sets": {**JOB, **sets}},
        **agg, "kills": kills,
        "audit": {"ok": report["audit"]["ok"], "samples_lost": report["samples_lost"],
                  "duplicates_trained": report["duplicates_trained"], "run_ok": report["ok"]},
        "run_dir": str(run_dir), "wall_s": round(time.monotonic() - t0, 1)}, load)
    return 0


REPORT_TITLE = "Trainer loss"
#: what each breakdown phase is, for the docs' table
LABELS = {"restart_wait": "the supervisor's restart delay (kill → the new process)",
          "python": "interpreter, CLI, config and imports up to the actor's setup (torch among them)",
          "torch_import": "torch import in setup (0: imported before)",
          "engine_imports": "DeepSpeed and transformers imports",
          "engine_other": "the engine's other construction",
          "engine_process_group": "process group (gloo, a world of one)",
          "engine_model_load": "model load (transformers' modelling imports included)",
          "engine_deepspeed_initialize": "`deepspeed.initialize`",
          "checkpoint_load": "checkpoint load",
          "clients": "Kafka clients (and the `control` catch-up)",
          "publisher": "weight publisher (the announced head, `resume`)",
          "first_step": "setup done → the first step's metric (fetch and train it)"}


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``trainer_loss.json`` (none for a quick
    run), beside ``trainer_loss_before.json`` (the same benchmark before the restart was made
    faster) when that exists."""
    d = load("trainer_loss")
    if not d or d.get("quick"):
        return []
    b = load("trainer_loss_before")
    arms = [("before", b), ("now", d)] if b and not b.get("quick") else [("now", d)]
    out = [*heading(REPORT_TITLE),
           f"**{REPORT_TITLE}** — `python -m astraflow.benchmarks.trainer_loss` (the demo job under the chaos "
           f"runner; the trainer SIGKILLed {d['kills_measured']} times, two steps past a checkpoint, restarted after "
           f"{d['method']['restart_delay_s']:g} s; seconds, median (min–max) over the kills{load_note(d)})"
           + ("; *before*: the same run before the trainer stopped importing MLflow with DeepSpeed "
              f"(`--out benchmarks/results/trainer_loss_before.json`{load_note(b)})" if len(arms) > 1 else ""), "",
           "| from the SIGKILL to | " + " | ".join(a for a, _ in arms) + " |", "|---|" + "---:|" * len(arms)]
    out.append("| the next trained step (`next_batch_after_kill_s`) | "
               + " | ".join(fmt_spread(x["next_batch_after_kill_s"], ".1f") for _, x in arms) + " |")
    out.append("| a step past the one trained before the kill | "
               + " | ".join(fmt_spread(x["new_step_after_kill_s"], ".1f") if x.get("new_step_after_kill_s") else "–"
                            for _, x in arms) + " |")
    out += ["", "| where the time to the next trained step goes | " + " | ".join(a for a, _ in arms) + " |",
            "|---|" + "---:|" * len(arms)]
    out += [f"| {LABELS[p]} | " + " | ".join(fmt_spread(x["breakdown_s"][p], ".2f") for _, x in arms) + " |"
            for p in BREAKDOWN]
    return out + [""]

if __name__ == "__main__":
    raise SystemExit(main())
