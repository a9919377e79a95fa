"""The embedded broker's JVM with C1 alone (the default) vs tiered compilation (C1 then C2),
side by side in one run.

``astraflow run`` starts its own embedded broker, which lives as long as the run. With tiered
compilation HotSpot's C2 compiler recompiles the broker's hot paths for minutes, on the same
two cores the job's processes need. Each repetition runs the demo job (``--steps`` steps, no
evaluation during it) once per arm, the arms alternating, each as a user runs it: ``astraflow
run`` as a fresh process with its fresh broker. The only difference is the broker JVM's
options (``ASTRAFLOW_BROKER_JVM_OPTS=-XX:TieredStopAtLevel=4`` for the tiered arm, after the
default ``-XX:TieredStopAtLevel=1``). Per run, from a sampler of every process's CPU time:

* wall seconds of the whole run (launch to exit: start-up, training, the final audit);
* steady-state seconds per step (the end of step 2 to the last step);
* CPU seconds per step in that window: the broker's and every process's together;
* the broker's CPU seconds over the whole run.

Every number is a median (min–max) over ``--repeats`` repetitions; ratios are paired within
a repetition. Prints one table; writes ``benchmarks/results/broker_jit.json``.

    python -m astraflow.benchmarks.broker_jit                  # 150 steps, 3 repetitions
    python -m astraflow.benchmarks.broker_jit --quick          # 6 steps, 1 repetition (smoke)
"""

from __future__ import annotations

import bisect
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from astraflow.benchmarks.job_bench import job_arguments, run_repetitions
from astraflow.benchmarks.lib.results import load_now
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.benchmarks.lib.steady import steady_steps
from astraflow.benchmarks.lib.table import print_header
from astraflow.runs import remove_trees
from astraflow.topics.broker import JVM_OPTS_ENV

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "broker_jit.json"
#: arm -> the broker JVM options added after the defaults
ARMS = {"c1": "", "tiered": "-XX:TieredStopAtLevel=4"}
KEYS = ("wall_s", "s_per_step", "cpu_per_step", "broker_cpu_per_step", "broker_cpu_run_s")


def component(cmdline: list[str], root: bool) -> str | None:
    """Which part of a run a process is: ``broker``, a node's role, ``launcher`` (None: a helper)."""
    if root:
        return "launcher"
    if any("kafka.Kafka" == a for a in cmdline):
        return "broker"
    if "--role" in cmdline:
        return cmdline[cmdline.index("--role") + 1]
    return None


class CpuSampler:
    """Every ``period`` s, the CPU seconds so far of each process under ``pid``, by component
    (a process's last reading is kept after it exits; CPU a process used before it was first
    seen as what it is counts from then, so a window starts well after start-up)."""

    def __init__(self, pid: int, period: float = 0.25) -> None:
        self.root, self.period = psutil.Process(pid), period
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._procs: dict[int, tuple[psutil.Process, str | None]] = {}
        self._last: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.period)
        self.sample()

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            if self._procs.get(p.pid, (None, None))[1] is None:
                # (asked again until known: a child seen between fork and exec still has its parent's argv)
                try:
                    self._procs[p.pid] = (p, component(p.cmdline(), p.pid == self.root.pid))
                except psutil.Error:
                    continue
            proc, comp = self._procs[p.pid]
            if comp is None:
                continue
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            self._last[p.pid] = (comp, t.user + t.system)
        row: dict[str, float] = {}
        for comp, cpu in self._last.values():
            row[comp] = row.get(comp, 0.0) + cpu
        self.samples.append((time.time(), row))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> dict[str, float]:
        """The last sample taken at or before ``t`` (the first one if none was)."""
        i = bisect.bisect_right([s[0] for s in self.samples], t) - 1
        return self.samples[max(i, 0)][1]


def window_cpu(sampler: CpuSampler, t0: float, t1: float, steps: int) -> dict[str, float]:
    """CPU seconds per step of each component between ``t0`` and ``t1`` (``steps`` steps)."""
    a, b = sampler.at(t0), sampler.at(t1)
    return {k: (b[k] - a.get(k, 0.0)) / steps for k in b}


def run_once(args, rep: int, arm: str) -> dict:
    """One ``astraflow run`` of the job with the arm's broker options; its figures."""
    job = f"bench-jit-{arm}-{int(time.time())}-{rep}"
    run_dir = Path(args.run_root) / job
    env = dict(os.environ)
    if ARMS[arm]:
        env[JVM_OPTS_ENV] = " ".join(filter(None, [env.get(JVM_OPTS_ENV, ""), ARMS[arm]]))
    cmd = [sys.executable, "-m", "astraflow", "run", args.config, "--run-dir", str(run_dir), "--quiet",
           "--set", f"trainer.steps={args.steps}", "--set", "eval.every=0", "--set", f"job={job}"]
    print(f"--- repetition {rep + 1}: broker {arm} ({job})", flush=True)
    load = load_now()
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = CpuSampler(proc.pid)
    _, err = proc.communicate()
    wall = time.time() - t0
    sampler.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"astraflow run ({arm}) exited {proc.returncode}: {err.strip()[-2000:]}")
    _, step_ts, first, last = steady_steps(run_dir)
    per_step = window_cpu(sampler, step_ts[first], step_ts[last], last - first)
    remove_trees([run_dir])  # read: the next run needs the disk (a failed run's dir is kept, above)
    return {"wall_s": wall, "s_per_step": (step_ts[last] - step_ts[first]) / (last - first),
            "cpu_per_step": sum(per_step.values()), "broker_cpu_per_step": per_step.get("broker", 0.0),
            "cpu_per_step_by_component": per_step, "broker_cpu_run_s": sampler.samples[-1][1].get("broker", 0.0),
            "load_before": load["loadavg"], "run_dir": str(run_dir)}


def one_repetition(args, _broker: None, rep: int) -> dict:
    order = list(ARMS) if rep % 2 == 0 else list(ARMS)[::-1]  # neither arm always runs on a warmer box
    return {arm: run_once(args, rep, arm) for arm in order}


def aggregate(reps: list[dict]) -> dict:
    arms = {arm: {k: spread([r[arm][k] for r in reps]) for k in KEYS} for arm in ARMS}
    return {"arms": arms,
            "c1_over_tiered": {k: ratio_spread(arms["c1"][k], arms["tiered"][k]) for k in KEYS},
            "load_1m_at_run_start": spread([r[a]["load_before"][0] for r in reps for a in ARMS])}


def print_table(agg: dict) -> None:
    print_header(f"{'broker JIT':12} {'wall s':>22} {'s/step':>20} {'CPU s/step, all':>22} "
                 f"{'broker CPU s/step':>22} {'broker CPU s, run':>22}")
    for arm in (*ARMS, "c1_over_tiered"):
        r = agg["arms"].get(arm) or agg["c1_over_tiered"]
        print(f"{arm:12} {fmt_spread(r['wall_s'], '.1f' if arm in ARMS else '.2f'):>22} "
              f"{fmt_spread(r['s_per_step'], '.3f'):>20} {fmt_spread(r['cpu_per_step'], '.3f'):>22} "
              f"{fmt_spread(r['broker_cpu_per_step'], '.3f'):>22} "
              f"{fmt_spread(r['broker_cpu_run_s'], '.1f' if arm in ARMS else '.2f'):>22}")


def main(argv: list[str] | None = None) -> int:
    # 150 steps: long enough for C2's compiling to show, as a demo run's first minutes do
    args = job_arguments(__doc__.splitlines()[0], RESULTS, argv, lambda ap: ap.set_defaults(steps=150))
    # no shared broker: each run is an `astraflow run` with its own, the broker under test
    return run_repetitions("broker_jit", args, one_repetition, aggregate, print_table, shared_broker=False)


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, heading, load_note, fmt_spread as _sp)


REPORT_TITLE = "The embedded broker's JIT"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``broker_jit.json``."""
    d = load("broker_jit")
    if not d:
        return []
    out = [*heading(REPORT_TITLE),
           f"**The embedded broker's JVM: C1 alone (the default) vs tiered compilation** — "
           f"`python -m astraflow.benchmarks.broker_jit` (the demo job, {d['steps']} steps, each run an "
           "`astraflow run` with its own fresh broker, the arms alternating; CPU from a sampler of every process; "
           f"median (min–max) of {d['repeats']} repetitions{load_note(d)})", "",
           "| broker JIT | wall s (whole run) | s/step (steady) | CPU s/step, every process | broker CPU s/step | "
           "broker CPU s, whole run |", "|---|---:|---:|---:|---:|---:|"]
    for arm, label in (("c1", "C1 only (`-XX:TieredStopAtLevel=1`)"), ("tiered", "tiered (C1 + C2)")):
        r = d["arms"][arm]
        out.append(f"| {label} | {_sp(r['wall_s'], '.1f')} | {_sp(r['s_per_step'], '.3f')} | "
                   f"{_sp(r['cpu_per_step'], '.3f')} | {_sp(r['broker_cpu_per_step'], '.3f')} | "
                   f"{_sp(r['broker_cpu_run_s'], '.1f')} |")
    q = d["c1_over_tiered"]
    out += ["", f"C1 / tiered, paired by repetition: wall {_sp(q['wall_s'])}, s/step {_sp(q['s_per_step'])}, "
                f"CPU per step {_sp(q['cpu_per_step'])}, the broker's CPU per step {_sp(q['broker_cpu_per_step'])}.",
            ""]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
