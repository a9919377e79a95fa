"""The in-process baseline: the same GRPO job as one plain Python process, no broker.

What a user would write instead of the distributed system, built from the project's own
parts so that only the plumbing differs: the CPU engine generates through a RaaS node's own
episode code (:meth:`EpisodeRunner.roll_out <astraflow.actors.episodes.EpisodeRunner.roll_out>`
running the job's registered workflow and reward, so every sample draws from the same seed
— ``(job seed, task id, sample index)`` — and is batched into engine calls as in
``astraflow run``), the project's ``DeepSpeedTrainer`` (ZeRO stage, loss, LR, seed from the
job config, as the trainer process builds it) trains, and the new weights are copied
straight into the engine. The prompts, task ids and batches
are the ones the dataflow makes for the same config with ``max_staleness: 0``: batch
``k`` holds tasks ``k*B .. k*B+B-1``, rolled out at version ``k`` in calls of
``rollout.tasks_per_call`` tasks, as a RaaS node polls them.

Per step it times R (rollout of the batch), T (``train_step``) and W (weights into the
engine), each alone, since nothing overlaps here. Held-out accuracy (the evaluator's own
function) is measured at version 0, every ``--eval-every`` versions and at the end,
outside the timed loop. Knows nothing about Kafka.

``--staleness 1`` rolls batch ``k + 1`` out with version ``k`` (what ``mode: async`` with
``max_staleness: 1`` does), and ``--overlap`` runs that rollout on a second thread while
batch ``k`` trains: the async job as one process, each side with ``--threads`` torch
threads — what a user who wants the overlap without a broker would write, and the machine's
own ceiling for overlapping R and T (what the two sides cost each other on shared cores,
with no plumbing at all). With and without ``--overlap`` the work is the same: the same
groups, byte for byte (``tests/e2e/test_inprocess_baseline.py``); only the schedule differs.

    python -m astraflow.benchmarks.inprocess_loop [--config C] [--steps N] [--threads T]
        [--staleness 0|1] [--overlap] [--out J]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from astraflow.actors.common import (configure_sandbox, make_rollout_engine, make_train_engine, model_path,
                                     prompt_renderer, set_threads, to_train_batch)
from astraflow.actors.episodes import EpisodeRunner
from astraflow.actors.evaluator import heldout_accuracy, heldout_problems
from astraflow.actors.tasks import make_task
from astraflow.config import load_config
from astraflow.topics import Batch
from astraflow.workflows.datasets import load_prompts

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before the trainer imports DeepSpeed (in make_train_engine)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "examples" / "arithmetic_grpo.yaml"


def job_tasks(cfg, steps: int, staleness: int = 0) -> list:
    """The tasks the dataflow schedules for ``steps`` batches, made as it makes them
    (:func:`~astraflow.actors.tasks.make_task`: prompt offsets in the task ids, the job's
    workflow, its first role and ``workflow.params``; an episode of several roles trains
    every role); batch ``k``'s at version ``k - staleness`` (at least 0), every policy's."""
    if cfg.data.source not in ("arithmetic", "arithmetic_chat"):
        raise ValueError(f"the in-process baseline supports data.source 'arithmetic' and 'arithmetic_chat', not "
                         f"{cfg.data.source!r}")
    B = cfg.dataflow.groups_per_batch
    prompts = load_prompts(cfg.data.source, cfg.data.num_prompts or 2 * cfg.trainer.steps * B, seed=cfg.data.seed,
                           max_digits=cfg.data.max_digits, ops=cfg.data.ops)
    if len(prompts) < steps * B:
        raise ValueError(f"{len(prompts)} prompts cannot fill {steps} batches of {B}")
    render = prompt_renderer(cfg)  # a chat model's prompts as the dataflow renders them
    return [make_task(cfg, p, i, version=(v := max(0, i // B - staleness)),
                      versions=dict.fromkeys(cfg.policy_names, v), train=cfg.role_policies, render=render)
            for i, p in enumerate(prompts[: steps * B])]


def run(cfg, steps: int, threads: int | None = None, eval_every: int = 0,
        on_batch: Callable[[int, list], None] | None = None, *, staleness: int = 0,
        overlap: bool = False) -> dict[str, Any]:
    """Train ``steps`` versions in this process; returns per-step timings and accuracies.

    ``staleness`` 1: batch ``k + 1`` is rolled out with version ``k``, after batch ``k``
    trains, or (``overlap``) on a second thread while it trains; ``threads`` is then each
    side's torch threads. ``on_batch(step, groups)`` sees each batch's trajectory groups
    (outside the timing)."""
    import torch  # (torch and transformers: ~3 s of imports that --help and the callers of
    from transformers import AutoTokenizer  # time_to_accuracy / job_tasks skip)

    if cfg.rollout.engine.kind != "cpu":
        raise ValueError(f"the in-process baseline runs the CPU engine, not rollout.engine.kind "
                         f"{cfg.rollout.engine.kind!r}")
    if staleness not in (0, 1):
        raise ValueError(f"staleness must be 0 or 1, got {staleness}")
    if overlap and not staleness:
        raise ValueError("overlap needs staleness 1: batch k + 1 is rolled out while batch k trains")
    t_start = time.perf_counter()
    # One budget for both phases when they never run at once; each side's when they overlap.
    n_threads = threads or max(cfg.rollout.engine.threads, cfg.trainer.engine.threads, 1)
    set_threads(n_threads)
    configure_sandbox(cfg)
    path = model_path(cfg)
    engine = make_rollout_engine(cfg, path)
    trainer = make_train_engine(cfg, path)
    set_threads(n_threads)  # the engines may set their own; the whole loop keeps one budget
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    # A RaaS node's episode runner (actors/rollout.py builds it the same way for one policy).
    runner = EpisodeRunner(cfg.policy, "inprocess", engine, tokenizer, cfg.seed, engine_lock=threading.Lock(),
                           batch_invariant=cfg.rollout.batch_invariant)
    problems = heldout_problems(cfg)
    tasks = job_tasks(cfg, steps, staleness)
    dtype = getattr(torch, cfg.trainer.publish_dtype)
    B, per_call = cfg.dataflow.groups_per_batch, max(1, cfg.rollout.tasks_per_call)
    # torch's intra-op thread count is per OS thread, taken from the process-wide setting at
    # a thread's first op: the rollout thread sets its own; the runner's episode threads (the
    # engine calls run there) start after set_threads above.
    pool = (ThreadPoolExecutor(1, thread_name_prefix="inprocess-rollout", initializer=torch.set_num_threads,
                               initargs=(n_threads,)) if overlap else None)
    setup_s = time.perf_counter() - t_start

    def evaluate(version: int, loop_s: float) -> dict[str, Any]:
        t0 = time.perf_counter()
        per_problem: list[float] = []
        acc = heldout_accuracy(cfg, engine, tokenizer, problems, per_row=per_problem)
        return {"version": version, "accuracy": acc, "loop_s": loop_s, "eval_s": time.perf_counter() - t0,
                "per_problem": per_problem}

    def rollout(k: int) -> tuple[list, float]:
        t0 = time.perf_counter()
        batch_tasks = tasks[k * B:(k + 1) * B]
        groups = [g for i in range(0, B, per_call)  # in polls of tasks_per_call tasks, as a node
                  for per_task in runner.roll_out(batch_tasks[i:i + per_call]) for g in per_task]
        failed = [g for g in groups if g.status != "ok"]
        if failed:  # the system's dataflow would schedule these again; here there is no one to
            raise RuntimeError(f"in-process baseline: {len(failed)} episode(s) of batch {k} failed, "
                               f"first {failed[0].task_id}: {failed[0].error}")
        return groups, time.perf_counter() - t0

    evals = [evaluate(0, 0.0)]
    rows, loop_s = [], 0.0
    try:
        ready = None
        if staleness:  # batch 0 goes out with version 0, before the first step
            ready = rollout(0)
            loop_s += ready[1]
        for k in range(steps):
            t0 = time.perf_counter()
            groups, R = ready if staleness else rollout(k)
            ahead = pool.submit(rollout, k + 1) if pool is not None and k + 1 < steps else None
            t1 = time.perf_counter()
            out = trainer.train_step(to_train_batch(Batch(cfg.policy, k, groups, [])))
            t2 = time.perf_counter()
            if staleness:  # batch k + 1, with version k still in the engine (none after the last step)
                ready = (ahead.result() if ahead is not None else rollout(k + 1)) if k + 1 < steps else ([], 0.0)
                R = ready[1]
            t3 = time.perf_counter()
            named = trainer.named_weights()
            engine.load_weights({n: (v.to(dtype) if v.is_floating_point() else v) for n, v in named.items()}, k + 1)
            t4 = time.perf_counter()
            loop_s += t4 - t0
            if on_batch is not None:
                on_batch(k, groups)
            # R: the rollout this step ran (batch k + 1's when stale), timed on its own thread
            rows.append({"step": k + 1, "R_s": R, "T_s": t2 - t1, "W_s": t4 - t3, "step_s": t4 - t0,
                         "reward": statistics.fmean(s.reward for g in groups for s in g.samples),
                         "loss": float(out.get("loss", float("nan"))),
                         # the trainer's own metrics of the step (not its per-update copies)
                         "train": {n: float(v) for n, v in out.items()
                                   if isinstance(v, (int, float)) and "_mb" not in n}})
            if (eval_every and (k + 1) % eval_every == 0) or k + 1 == steps:
                evals.append(evaluate(k + 1, loop_s))
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        runner.close()
        trainer.close()
        engine.close()
    # With staleness the last step rolls nothing out (there is no next batch): not a steady step.
    result = summarise(rows, evals, setup_s, n_threads, steps, drop_last=bool(staleness))
    result.update(staleness=staleness, overlap=overlap)
    return result


def summarise(rows: list[dict], evals: list[dict], setup_s: float, threads: int, steps: int,
              drop_last: bool = False) -> dict[str, Any]:
    """Steady-state per-step means (steps 3.., as ``async_vs_sync`` measures the system:
    from the end of step 2; without the last with ``drop_last``), the accuracy curve against
    loop time, and the totals."""
    steady = rows[2:len(rows) - int(drop_last)] or rows
    mean = lambda key: statistics.fmean(r[key] for r in steady)  # noqa: E731
    R, T, W = mean("R_s"), mean("T_s"), mean("W_s")
    # A step's wall time: R + T + W in turn, about max(R, T) + W when they overlap.
    return {"steps": steps, "threads": threads, "setup_s": setup_s, "R_s": R, "T_s": T, "W_s": W,
            "s_per_step": mean("step_s"), "loop_s": sum(r["step_s"] for r in rows),
            "accuracy_initial": evals[0]["accuracy"], "accuracy_final": evals[-1]["accuracy"],
            "accuracy_curve": evals, "per_step": rows}


def time_to_accuracy(curve: list[dict], target: float) -> float | None:
    """Loop seconds at the first evaluated version whose accuracy reaches ``target``
    (``None`` if none does)."""
    for e in curve:
        if e["version"] > 0 and e["accuracy"] >= target:
            return e["loop_s"]
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(DEFAULT_CONFIG))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the config's per-component threads)")
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--staleness", type=int, default=0, choices=(0, 1),
                    help="1: batch k + 1 is rolled out with version k (as async with max_staleness 1)")
    ap.add_argument("--overlap", action="store_true",
                    help="with --staleness 1: roll out on a second thread while the batch before trains")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--out", type=Path, help="write the result as JSON here")
    args = ap.parse_args(argv)
    overrides = {"mode": "sync", "trainer.steps": args.steps}
    for pair in args.set:
        key, sep, value = pair.partition("=")
        if not sep:
            ap.error(f"--set expects KEY=VALUE, got {pair!r}")
        overrides[key] = yaml.safe_load(value)
    cfg = load_config(args.config, overrides)
    if args.overlap and not args.staleness:
        ap.error("--overlap needs --staleness 1")
    result = run(cfg, args.steps, args.threads or None, args.eval_every, staleness=args.staleness,
                 overlap=args.overlap)
    result["config"] = args.config
    how = "overlapped" if args.overlap else "in turn"
    print(f"in-process: {args.steps} steps, staleness {args.staleness}, {result['threads']} thread(s) per side: "
          f"{result['s_per_step']:.3f} s/step (R {result['R_s']:.3f}, T {result['T_s']:.3f}, W {result['W_s']:.3f}, "
          f"{how}), setup {result['setup_s']:.1f} s, "
          f"accuracy {result['accuracy_initial']:.3f} -> {result['accuracy_final']:.3f}", file=sys.stderr)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
