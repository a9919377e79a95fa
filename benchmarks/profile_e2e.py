"""Where the cores go in a demo-like run: CPU per trained step, per component, thread, function.

Runs ``astraflow run`` (async, the demo config) on one embedded broker started here, so
the JVM's CPU time is read too. Each run is made twice, for ``N`` and ``2N`` steps, and
the difference divided by ``N`` is the steady-state cost of one step: start-up (imports,
model load, DeepSpeed init) and shutdown cancel out; ``time_to_first_step_s`` covers
those. Two kinds of run:

* plain: each process records only its CPU seconds — the split without profiler overhead;
* profiled: every thread of every Python process has its own cProfile
  (``profile_hook/sitecustomize.py``, put on the job's ``PYTHONPATH``), clocked by the
  thread's CPU time — which functions spend it. The profiler slows Python-heavy threads
  more than torch-heavy ones; both runs' s/step are shown.

Writes ``benchmarks/results/profile_e2e.md`` (tables) and ``profile_e2e.json``.

    python -m astraflow.benchmarks.profile_e2e [--steps 30] [--config C] [--top 10]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil

from astraflow.benchmarks.async_vs_sync import analyse
from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.config import load_config
from astraflow.topics import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[1]
HOOK = Path(__file__).resolve().parent / "profile_hook"
RESULTS = ROOT / "benchmarks" / "results" / "profile_e2e.json"

#: (bucket, substrings of a function's file or name); the first match wins
BUCKETS = [
    ("torch compute", ("torch/nn", "torch._C", "built-in method torch", "torch/_tensor", "torch/autograd",
                       "torch/optim", "of 'torch._C", "torch/functional", "torch/_ops")),
    ("transformers", ("transformers/",)),
    ("deepspeed", ("deepspeed/",)),
    ("weight codec (zstd, BLAKE3, numpy)", ("zstd", "zstandard", "blake3", "_hashlib", "hashlib", "sha256", "weights/codec",
                                            "weights/format", "numpy")),
    ("kafka-python client", ("kafka/",)),
    ("socket / select / locks", ("selectors", "socket", "select.", "ssl", "acquire", "threading.py", "queue.py",
                                 "'wait'", "sleep")),
    ("record encode/decode (orjson)", ("orjson", "topics/codec", "topics/messages", "dataclasses")),
    ("tracing (opentelemetry)", ("opentelemetry",)),
    ("actors / astraflow", ("/actors/", "/astraflow/", "/topics/", "/workflows/", "/algorithms/", "/engines/",
                            "/weights/", "pykka")),
    ("logging", ("logging/",)),
]


def bucket_of(func: tuple[str, int, str]) -> str:
    text = f"{func[0]}:{func[2]}"
    for name, keys in BUCKETS:
        if any(k in text for k in keys):
            return name
    return "other Python"


def run_job_process(config: str, bootstrap: str, run_dir: Path, overrides: dict, prof_dir: Path,
                    mode: str) -> None:
    """``astraflow run`` as a subprocess with the profiling hook on its ``PYTHONPATH``."""
    env = dict(os.environ, AF_PROFILE_DIR=str(prof_dir), AF_PROFILE_MODE=mode,
               PYTHONPATH=os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "astraflow", "run", config, "--bootstrap-servers", bootstrap,
           "--run-dir", str(run_dir), "--quiet", *[a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"astraflow run failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


def processes(prof_dir: Path) -> dict[str, dict]:
    """Per component: CPU seconds, and per thread (name without its start index) the
    functions' ``[self s, cumulative s, calls]`` summed over the component's processes."""
    out: dict[str, dict] = {}
    for meta in sorted(prof_dir.glob("*.json")):
        p = json.loads(meta.read_text())
        comp = out.setdefault(component(p["label"]), {"cpu_s": 0.0, "threads": {}})
        comp["cpu_s"] += p["cpu_user_s"] + p["cpu_sys_s"]
        for prof in sorted(prof_dir.glob(f"{p['label']}.{p['pid']}.*.prof")):
            try:
                st = pstats.Stats(str(prof))
            except Exception:  # noqa: BLE001 - a profile cut off at exit
                continue
            thread = prof.stem[len(f"{p['label']}.{p['pid']}."):].split("-", 1)[1]
            funcs = comp["threads"].setdefault(thread, {})
            for f, (cc, _nc, tt, ct, _callers) in st.stats.items():
                acc = funcs.setdefault(_name(f), [0.0, 0.0, 0])
                acc[0] += tt
                acc[1] += ct
                acc[2] += cc
    return out


def _name(f: tuple[str, int, str]) -> str:
    file = f[0]
    for cut in ("site-packages/", "/work/main/", "lib/python3."):
        if cut in file:
            file = file.split(cut, 1)[1]
    return f"{file}:{f[1]}({f[2]})" if f[0] != "~" else f[2]


def component(label: str) -> str:
    if label.startswith("raas"):
        return "raas"
    return "launcher" if label == "astraflow-run" else label


def per_step(long: dict[str, dict], short: dict[str, dict], steps: int) -> dict[str, dict]:
    """``(long - short) / steps`` for every component, thread and function."""
    out = {}
    for comp, L in long.items():
        S = short.get(comp, {"cpu_s": 0.0, "threads": {}})
        threads = {}
        for thread, funcs in L["threads"].items():
            sf = S["threads"].get(thread, {})
            diff = {f: [(v[0] - sf.get(f, [0, 0, 0])[0]) / steps, (v[1] - sf.get(f, [0, 0, 0])[1]) / steps,
                        (v[2] - sf.get(f, [0, 0, 0])[2]) / steps] for f, v in funcs.items()}
            threads[thread] = diff
        out[comp] = {"cpu_s": (L["cpu_s"] - S["cpu_s"]) / steps, "threads": threads}
    return out


def summarise(plain: dict, prof: dict, broker_cpu: dict, runs: dict, steps: int, top: int) -> dict:
    step_plain = per_step(plain["long"], plain["short"], steps)
    step_prof = per_step(prof["long"], prof["short"], steps)
    cpu = {c: v["cpu_s"] for c, v in step_plain.items()}
    cpu["broker (JVM)"] = (broker_cpu["plain-long"] - broker_cpu["plain-short"]) / steps
    fixed = {c: plain["short"][c]["cpu_s"] - steps * step_plain[c]["cpu_s"] for c in step_plain}
    fixed["broker (JVM)"] = broker_cpu["plain-short"] - steps * cpu["broker (JVM)"]
    threads = {}
    for comp, v in step_prof.items():
        for thread, funcs in v["threads"].items():
            total = sum(x[0] for x in funcs.values())
            buckets: dict[str, float] = defaultdict(float)
            for f, x in funcs.items():
                buckets[bucket_of(f)] += x[0]
            ranked = sorted(funcs.items(), key=lambda kv: -kv[1][0])[:top]
            threads[f"{comp} / {thread}"] = {
                "cpu_s_per_step": total, "buckets": dict(buckets),
                "top_self": [{"function": f, "self_s": x[0], "cum_s": x[1], "calls": x[2]} for f, x in ranked]}
    return {"steps_difference": steps, "runs": runs, "cpu_per_step_by_component_s": cpu,
            "cpu_profiled_per_step_by_component_s": {c: v["cpu_s"] for c, v in step_prof.items()},
            "fixed_cpu_by_component_s": fixed, "threads": threads}


def bucket_of(name: str) -> str:
    for b, keys in BUCKETS:
        if any(k in name for k in keys):
            return b
    return "other Python"


def markdown(s: dict) -> str:
    r, n = s["runs"], s["steps_difference"]
    lines = [f"# Where one training step's CPU goes (demo job, async, 1 RaaS node)", "",
             "Generated by `python -m astraflow.benchmarks.profile_e2e`: every number is CPU seconds (user + system) "
             f"per trained step, the difference between a {2 * n}-step and an {n}-step run divided by {n}, so start-up "
             "and shutdown cancel out. Runs (s/step steady state, time to first step, load average before):", ""]
    for k, v in r.items():
        lines.append(f"- {k}: {v['s_per_step']:.2f} s/step, first step after {v['time_to_first_step_s']:.1f} s, "
                     f"load {v['load_before']}")
    lines += ["", "## CPU per step by component (plain runs)", "",
              "| component | CPU s per step | CPU s per step, profiled | fixed CPU s (start-up + shutdown) |",
              "|---|---:|---:|---:|"]
    cpu = s["cpu_per_step_by_component_s"]
    for c in sorted(cpu, key=lambda c: -cpu[c]):
        lines.append(f"| {c} | {cpu[c]:.3f} | {s['cpu_profiled_per_step_by_component_s'].get(c, float('nan')):.3f} | "
                     f"{s['fixed_cpu_by_component_s'].get(c, float('nan')):.1f} |")
    lines += [f"| **total** | {sum(cpu.values()):.3f} | | |", "",
              "## CPU per step by thread and kind of work (profiled runs, self time)", "",
              "| thread | CPU s/step | " + " | ".join(b for b, _ in BUCKETS) + " | other |",
              "|---|---:|" + "---:|" * (len(BUCKETS) + 1)]
    shown = sorted(((k, t) for k, t in s["threads"].items() if t["cpu_s_per_step"] >= 0.002),
                   key=lambda kv: -kv[1]["cpu_s_per_step"])
    for name, t in shown:
        cells = [f"{t['buckets'].get(b, 0.0):.3f}" for b, _ in BUCKETS] + [f"{t['buckets'].get('other Python', 0.0):.3f}"]
        lines.append(f"| {name} | {t['cpu_s_per_step']:.3f} | " + " | ".join(cells) + " |")
    lines += ["", "## Top functions per thread (self CPU s per step, profiled runs)", ""]
    for name, t in shown:
        if t["cpu_s_per_step"] < 0.01:
            continue
        lines += [f"### {name} ({t['cpu_s_per_step']:.3f} s/step)", "",
                  "| function | self s/step | cumulative s/step | calls/step |", "|---|---:|---:|---:|"]
        lines += [f"| `{f['function']}` | {f['self_s']:.4f} | {f['cum_s']:.4f} | {f['calls']:,.1f} |"
                  for f in t["top_self"]]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "arithmetic_grpo.yaml"))
    ap.add_argument("--steps", type=int, default=30, help="N: runs of N and 2N steps are differenced")
    ap.add_argument("--top", type=int, default=10, help="functions listed per thread")
    ap.add_argument("--quick", action="store_true", help="N = 4 (a smoke run)")
    ap.add_argument("--work-dir", default=str(ROOT / "runs" / "profile"))
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 4)
    if args.steps < 3:
        ap.error("--steps must be >= 3 (steady state starts after step 2)")
    load_before = load_now()
    work = Path(args.work_dir) / time.strftime("%Y%m%d-%H%M%S")
    runs, procs, broker_cpu = {}, {"plain": {}, "profiled": {}}, {}
    with EmbeddedBroker(heap="1g") as broker:
        jvm = psutil.Process(broker.pid)
        for mode, hook_mode in (("plain", "cpu"), ("profiled", "profile")):
            for length, steps in (("short", args.steps), ("long", 2 * args.steps)):
                key = f"{mode}-{length}"
                overrides = {"trainer.steps": steps, "eval.every": 0, "job": f"profile-{key}-{int(time.time())}"}
                cfg = load_config(args.config, overrides)
                run_dir, prof_dir = work / key, work / f"{key}-profiles"
                load = load_now()
                before = sum(jvm.cpu_times()[:2])
                print(f"--- {key} run: {steps} steps ({cfg.job})", flush=True)
                run_job_process(args.config, broker.bootstrap_servers, run_dir, overrides, prof_dir, hook_mode)
                broker_cpu[key] = sum(jvm.cpu_times()[:2]) - before
                runs[key] = {**analyse(run_dir, cfg.rollout.nodes), "load_before": load["loadavg"]}
                procs[mode][length] = processes(prof_dir)
    summary = summarise(procs["plain"], procs["profiled"], broker_cpu, runs, args.steps, args.top)
    md = markdown(summary)
    print(md)
    args.out.with_suffix(".md").write_text(md)
    write_results(args.out, {"benchmark": "profile_e2e", "config": args.config, **summary}, load_before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
