"""The sequential single-controller baseline of a multi-policy job: one process, no broker.

How a trainer-centred system (verl's single controller) runs a team of policies, built
from the project's own parts so that only the schedule and the plumbing differ. Per
iteration ``k``:

1. **generate**: the ``B`` episodes of batch ``k`` run the job's workflow through
   :func:`~astraflow.workflows.api.run_episode` with every role an
   :class:`~astraflow.workflows.api.EngineRole` on its policy's CPU engine, all at version
   ``k``. The episodes run on threads and a :class:`~astraflow.actors.episodes.CallBatcher` coalesces their calls
   into one engine call per policy and sampling setting (all first answers, then all
   verdicts, then all retries), as a controller batching a whole rollout would;
2. **train** each policy in turn on its role's ``B`` groups (a ``DeepSpeedTrainer`` per
   policy, built by ``make_train_engine`` from the policy's view of the config);
3. **copy** every policy's new weights into its engine (version ``k + 1``).

The tasks are the dataflow's for the same config: task ``t{offset:07d}-{prompt_id}`` over
the same prompts, the job seed in ``params["_job_seed"]``, the lead policy's sampling for
its roles and each other policy's rollout section for its own (as a RaaS node samples a
role it serves for another pool). Every row draws its seed from
:func:`~astraflow.workflows.api.role_seed`, so a sample does not depend on which rows share
its call; with ``rollout.batch_invariant`` each episode's call is an engine call of its own
and the samples are bit for bit those of ``run_episode`` alone. Each role's episode result
becomes a trajectory group through the RaaS node's own conversion, and batches become
training batches through the trainer's (``to_train_batch``).

Per iteration it times G (generation; each policy's engine seconds too), T per policy
(``train_step``) and W (weights into the engines); nothing overlaps. Held-out accuracy
(the solver alone and the team: the evaluator's own functions) is measured at the end,
outside the timing. Knows nothing about Kafka.

    python -m astraflow.benchmarks.sequential_multi [--config C] [--steps N] [--threads T] [--out J]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from astraflow.actors.episodes import CallBatcher
from astraflow.benchmarks.lib.child import write_result
from astraflow.benchmarks.lib.cli import parse_sets
from astraflow.config import load_config
from astraflow.engines.base import generated_context

os.environ.setdefault("DS_ACCELERATOR", "cpu")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "examples" / "solver_verifier.yaml"


def episode_tasks(cfg, steps: int) -> list:
    """The episodes the dataflow schedules for ``steps`` batches of a multi-policy job (task
    ids from prompt offsets, the workflow's roles and parameters, every policy at version ``k``
    for batch ``k``)."""
    from astraflow.benchmarks.inprocess_loop import job_tasks

    lead, wf = cfg.lead_policy, cfg.workflow
    B = cfg.view(lead).dataflow.groups_per_batch
    roles = dict(cfg.role_policies)
    return [dataclasses.replace(t, workflow=wf.name, role=next(iter(roles)), roles=roles, train=sorted(roles),
                                params=dict(wf.params), scheduled_versions=dict.fromkeys(cfg.policy_names, i // B))
            for i, t in enumerate(job_tasks(cfg.view(lead), steps))]


class _TeamRole:
    """A role on its policy's engine in this process, through the iteration's batcher."""

    def __init__(self, role, batcher: CallBatcher, index: int) -> None:
        self.role, self.batcher, self.index = role, batcher, index
        self.name, self.policy = role.name, role.policy

    def generate(self, prompts, *, seeds, max_new_tokens=None, temperature=None):
        params = self.role.params(max_new_tokens, temperature)
        gens = self.batcher.generate(self.index, prompts, params, seeds, policy=self.policy)
        return [self.role.turn(g, generated_context(p)) for g, p in zip(gens, prompts)]


class SequentialTeam:
    """Every policy's engine and trainer in this process; one iteration at a time."""

    def __init__(self, cfg, threads: int | None = None) -> None:
        import torch
        from transformers import AutoTokenizer

        from astraflow.actors.common import make_rollout_engine, make_train_engine, model_path, set_threads
        from astraflow.actors.episodes import EpisodeRunner
        from astraflow.workflows.api import get_workflow

        if len(cfg.policy_names) < 2:
            raise ValueError(f"{cfg.source}: the sequential multi-policy baseline needs `policies:` with at least "
                             f"two policies (use inprocess_loop.py for one)")
        for p in cfg.policy_names:
            if cfg.view(p).rollout.engine.kind != "cpu":
                raise ValueError(f"{cfg.source}: the baseline runs the CPU engine, not policies.{p}.rollout.engine."
                                 f"kind {cfg.view(p).rollout.engine.kind!r}")
        sizes = {p: cfg.view(p).dataflow.groups_per_batch for p in cfg.policy_names}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"{cfg.source}: the baseline trains every policy on the same episodes, so every "
                             f"policies.<p>.dataflow.groups_per_batch must be equal, got {sizes}")
        self.cfg, self.lead = cfg, cfg.lead_policy
        # One budget for every phase: nothing here runs at once.
        self.threads = threads or max(max(cfg.view(p).rollout.engine.threads, cfg.view(p).trainer.engine.threads, 1)
                                      for p in cfg.policy_names)
        set_threads(self.threads)
        self.views = {p: cfg.view(p) for p in cfg.policy_names}
        paths = {p: model_path(v) for p, v in self.views.items()}
        self.engines = {p: make_rollout_engine(v, paths[p]) for p, v in self.views.items()}
        for engine in self.engines.values():
            if hasattr(engine, "rows"):  # an emulated engine: keep every call's rows (the benchmarks re-price them)
                engine.rows = []
        self.trainers = {p: make_train_engine(v, paths[p]) for p, v in self.views.items()}
        set_threads(self.threads)  # the engines may set their own; the whole loop keeps one budget
        # The lead's node runs the episodes with its own tokenizer for every role, as here.
        self.tokenizer = AutoTokenizer.from_pretrained(str(paths[self.lead]))
        self.spec = get_workflow(cfg.workflow.name)
        self.dtypes = {p: getattr(torch, v.trainer.publish_dtype) for p, v in self.views.items()}
        self.batch_invariant = self.views[self.lead].rollout.batch_invariant
        # The node's conversion of an episode result into one trajectory group per role.
        self._groups = EpisodeRunner(self.lead, "sequential", self.engines[self.lead], self.tokenizer, cfg.seed,
                                     engine_lock=threading.Lock())
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.views[self.lead].dataflow.groups_per_batch),
                                        thread_name_prefix="sequential-ep")

    def sampling(self, policy: str, task) -> dict:
        """A role's sampling: the task's for the lead policy, the policy's rollout section otherwise."""
        if policy == self.lead:
            return task.sampling
        r = self.views[policy].rollout
        return {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k, "max_new_tokens": r.max_new_tokens}

    def roles(self, task, batcher: "CallBatcher | None" = None, index: int = 0) -> dict:
        """The episode's role handles: plain ``EngineRole``s, or through ``batcher``."""
        from astraflow.workflows.api import EngineRole
        roles = {name: EngineRole(name, policy, self.engines[policy], self.tokenizer, self.sampling(policy, task))
                 for name, policy in task.roles.items()}
        return roles if batcher is None else {n: _TeamRole(r, batcher, index) for n, r in roles.items()}

    def episode(self, task, roles: dict):
        from astraflow.workflows.api import Episode
        return Episode(task.task_id, task.prompt, task.answer, task.n_samples, roles, self.tokenizer,
                       {**task.params, "_job_seed": self.cfg.seed}, task.metadata, prompt_ids=tuple(task.prompt_ids))

    def rollout(self, tasks: Sequence) -> tuple[list, dict[str, list], "CallBatcher"]:
        """Run ``tasks``' episodes together; their results, each policy's groups, the batcher."""
        from astraflow.workflows.api import run_episode
        batcher = CallBatcher(self.engines, batch_invariant=self.batch_invariant, episodes=len(tasks))
        started = time.time()

        def one(i: int, task):
            try:
                return run_episode(self.spec, self.episode(task, self.roles(task, batcher, i)), self.cfg.seed)
            finally:
                batcher.leave()

        futures = [self._pool.submit(one, i, t) for i, t in enumerate(tasks)]
        results = []
        for task, f in zip(tasks, futures):
            try:
                results.append(f.result())
            except Exception as e:
                raise RuntimeError(f"episode {task.task_id} failed: {type(e).__name__}: {e}") from e
        groups: dict[str, list] = {p: [] for p in self.cfg.policy_names}
        for task, result in zip(tasks, results):
            prompt_ids = list(self.tokenizer.encode(task.prompt, add_special_tokens=False))
            for role in task.train:
                g = self._groups.group(task, role, task.roles, prompt_ids, result, started)
                if g.status != "ok":
                    raise RuntimeError(f"episode {task.task_id}: role {role!r}: {g.error}")
                groups[g.policy].append(g)
        return results, groups, batcher

    def train(self, step: int, groups: dict[str, list]) -> dict[str, dict]:
        """Train every policy on its groups, one after the other; per policy its seconds and outputs."""
        from astraflow.actors.common import to_train_batch
        from astraflow.topics import Batch
        out = {}
        for p, trainer in self.trainers.items():
            t0 = time.perf_counter()
            self._swap(trainer)
            res = trainer.train_step(to_train_batch(Batch(p, step, groups[p], [])))
            out[p] = {"T_s": time.perf_counter() - t0, "loss": float(res.get("loss", float("nan")))}
        return out

    def _swap(self, trainer) -> None:
        """On emulated devices, the policies share every device, so each policy's states are
        swapped to host memory and back once per iteration (the cost model's ``swap_s``);
        on the CPU everything stays in memory and nothing is charged."""
        device = getattr(trainer, "device", None)  # an emulated trainer's clock (a CPU trainer's is a torch.device)
        if len(self.trainers) > 1 and getattr(device, "cost", None) is not None:
            with device.hold("swap") as price:
                price(device.cost.swap_s(device.cfg.count))

    def emulated(self) -> dict[str, dict]:
        """Every emulated device's totals (``{}`` on the CPU), by component; an engine's also
        every call's row lengths (``rows``)."""
        out = {}
        for kind, parts in (("raas", self.engines), ("trainer", self.trainers)):
            for p, e in parts.items():
                if hasattr(getattr(e, "device", None), "summary"):
                    out[f"{kind}.{p}"] = {**e.device.summary(),
                                          **({"rows": e.rows} if getattr(e, "rows", None) is not None else {})}
        return out

    def publish(self, version: int) -> float:
        """Copy every trainer's weights into its policy's engine; the seconds it took."""
        t0 = time.perf_counter()
        for p, trainer in self.trainers.items():
            dtype = self.dtypes[p]
            named = trainer.named_weights()
            self.engines[p].load_weights({n: (v.to(dtype) if v.is_floating_point() else v)
                                          for n, v in named.items()}, version)
        return time.perf_counter() - t0

    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy of the lead policy alone and of the team (the evaluator's functions)."""
        from astraflow.actors.evaluator import heldout_accuracy, heldout_problems, team_accuracy
        problems = heldout_problems(self.views[self.lead])
        t0 = time.perf_counter()
        alone = heldout_accuracy(self.views[self.lead], self.engines[self.lead], self.tokenizer, problems)
        team = team_accuracy(self.cfg, self.engines, self.tokenizer, problems)
        return {"accuracy": alone, "team_accuracy": team, "eval_s": time.perf_counter() - t0,
                "versions": {p: e.version for p, e in self.engines.items()}}

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for trainer in self.trainers.values():
            trainer.close()
        for engine in self.engines.values():
            engine.close()


def run(cfg, steps: int, threads: int | None = None, evaluate: bool = True,
        on_iteration: Callable[[int, SequentialTeam, list, list, dict], None] | None = None) -> dict[str, Any]:
    """Run ``steps`` iterations (every policy one step each); per-iteration timings, the final accuracies.

    ``on_iteration(k, team, tasks, results, groups)`` sees each iteration's episodes before
    training (outside the timing)."""
    t_start = time.perf_counter()
    team = SequentialTeam(cfg, threads)
    B = team.views[team.lead].dataflow.groups_per_batch
    tasks = episode_tasks(cfg, steps)
    setup_s = time.perf_counter() - t_start
    rows = []
    try:
        for k in range(steps):
            batch = tasks[k * B:(k + 1) * B]
            t0 = time.perf_counter()
            results, groups, batcher = team.rollout(batch)
            t1 = time.perf_counter()
            if on_iteration is not None:
                on_iteration(k, team, batch, results, groups)
            t2 = time.perf_counter()
            trained = team.train(k, groups)
            w = team.publish(k + 1)
            rows.append({"iteration": k + 1, "G_s": t1 - t0, "W_s": w,
                         **{f"G_{p}_s": s for p, s in batcher.engine_s.items()},
                         **{f"calls_{p}": n for p, n in batcher.calls.items()},
                         **{f"T_{p}_s": t["T_s"] for p, t in trained.items()},
                         **{f"loss_{p}": t["loss"] for p, t in trained.items()},
                         **{f"reward_{p}": statistics.fmean(s.reward for g in groups[p] for s in g.samples)
                            for p in groups},
                         "team_reward": statistics.fmean(float(r.team_reward or 0.0) for r in results),
                         "samples": {p: sum(len(g.samples) for g in groups[p]) for p in groups},
                         "s": (t1 - t0) + (time.perf_counter() - t2)})
        final = team.evaluate() if evaluate else {}
        emulated = team.emulated()
    finally:
        team.close()
    out = summarise(rows, final, setup_s, team.threads, steps, list(cfg.policy_names))
    return {**out, "emulated": emulated} if emulated else out


def summarise(rows: list[dict], final: dict, setup_s: float, threads: int, steps: int,
              policies: list[str]) -> dict[str, Any]:
    """Steady-state means over iterations 3.. (as the Kafka arms are measured: from the end of
    step 2), the totals and the final accuracies."""
    steady = rows[2:] if len(rows) > 2 else rows
    mean = lambda key: statistics.fmean(r[key] for r in steady)  # noqa: E731
    return {"steps": steps, "threads": threads, "policies": policies, "setup_s": setup_s,
            "s_per_iter": mean("s"), "G_s": mean("G_s"), "W_s": mean("W_s"),
            **{f"T_{p}_s": mean(f"T_{p}_s") for p in policies},
            **{f"G_{p}_s": mean(f"G_{p}_s") for p in policies},
            "loop_s": sum(r["s"] for r in rows),
            "accuracy_final": final.get("accuracy"), "team_accuracy_final": final.get("team_accuracy"),
            "eval_s": final.get("eval_s"), "per_iteration": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(DEFAULT_CONFIG))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the config's per-component threads)")
    ap.add_argument("--no-eval", action="store_true", help="skip the final held-out evaluation")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--out", type=Path, help="write the result as JSON here")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, {"trainer.steps": args.steps, **parse_sets(ap, args.set)})
    result = run(cfg, args.steps, args.threads or None, evaluate=not args.no_eval)
    result["config"] = args.config
    parts = " + ".join(f"T_{p} {result[f'T_{p}_s']:.3f}" for p in result["policies"])
    print(f"sequential: {args.steps} iterations, {result['threads']} thread(s): {result['s_per_iter']:.3f} s/iter "
          f"(G {result['G_s']:.3f} + {parts} + W {result['W_s']:.3f}), setup {result['setup_s']:.1f} s, "
          f"team accuracy {result['team_accuracy_final']}", file=sys.stderr)
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
