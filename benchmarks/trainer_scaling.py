"""Trainer scaling: samples/s and peak RSS per rank of the DeepSpeed trainer, 1 and 2 ranks x ZeRO 0-3.

Each configuration is a fresh data-parallel job started with torch's own launcher
(``python -m torch.distributed.run``; gloo on CPU, NCCL on GPU) running this module's
``worker`` in every rank: the real ``DeepSpeedTrainer`` on a random-init Qwen3 causal LM
(~113 M parameters, written once to ``$ASTRAFLOW_CACHE/bench-models``) large enough that
parameters, gradients and AdamW state dominate a rank's memory. Every configuration
trains the same seeded batch (8 samples x 32 tokens): one warm-up step (reported apart,
not in the statistics), then ``--steps`` timed steps, each started behind a barrier and
timed as its slowest rank. Per rank it reads ``ru_maxrss`` (peak RSS) and the RSS after
the steps. A config is fresh processes, so one config's allocations never count in another's.

It owns the benchmark model, the synthetic batch and the worker; it does not shard the
batch or partition state itself (that is the trainer's and DeepSpeed's job). The worker
with ``--check`` also asserts a finite loss and that every rank ends with the same weights,
which is what ``benchmarks/gpu_check.sh`` runs on GPUs.

    python -m astraflow.benchmarks.trainer_scaling            # 8 configs, about a minute each on 2 cores
    python -m astraflow.benchmarks.trainer_scaling --quick    # tiny model, 1 timed step: smoke test
    python -m astraflow.benchmarks.trainer_scaling --ranks 2 --zero 3 --zero-sizes deepspeed --out /tmp/z3.json

``--zero-sizes`` picks the ZeRO bucket and live-parameter sizes: the trainer config's
CPU-sized defaults (``trainer``) or DeepSpeed's own GPU-sized ones (``deepspeed``, what the
trainer used before they were config keys); the ones used are in the results' settings.

Prints one table; writes ``benchmarks/results/trainer_scaling.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.stats import fmt_spread, spread
from astraflow.engines.config import ZERO_SIZE_KEYS, TrainerConfig
from astraflow.models.bootstrap import cache_root

RESULTS = Path(__file__).resolve().parent / "results" / "trainer_scaling.json"
#: DeepSpeed 0.19's zero_optimization defaults for the trainer's ZERO_SIZE_KEYS (sized for GPU jobs).
DEEPSPEED_ZERO_SIZES = {"reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000,
                        "stage3_prefetch_bucket_size": 50_000_000, "stage3_param_persistence_threshold": 100_000,
                        "stage3_max_live_parameters": 1_000_000_000, "stage3_max_reuse_distance": 1_000_000_000,
                        "sub_group_size": 1_000_000_000}


def zero_sizes(which: str) -> dict[str, int]:
    """The ZeRO sizes a run uses: the trainer config's defaults or DeepSpeed's own."""
    if which == "deepspeed":
        return dict(DEEPSPEED_ZERO_SIZES)
    return {key: getattr(TrainerConfig(), key) for key in ZERO_SIZE_KEYS}
VOCAB = 128  # the character tokenizer's size: the model's bulk is its blocks, not embeddings


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of the random-init benchmark model (hashed into its cache key)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int = 4
    head_dim: int = 64
    seed: int = 0

    def key(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return f"{self.name}-{hashlib.sha256(blob).hexdigest()[:12]}"


FULL = ModelSpec("qwen3-113m", hidden_size=1024, intermediate_size=2816, num_layers=10, num_heads=16)
QUICK = ModelSpec("qwen3-tiny", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16)


def bench_model_root() -> Path:
    return cache_root().parent / "bench-models"


def ensure_bench_model(spec: ModelSpec, root: Path | None = None) -> tuple[Path, int]:
    """The cached HF directory of ``spec`` and its parameter count, building it first if absent.

    Written to a temporary sibling and renamed, so a crashed build is never reused."""
    root = root or bench_model_root()
    path = root / spec.key()
    marker = path / "bench_model.json"
    if marker.exists():
        return path, json.loads(marker.read_text())["parameters"]
    import torch  # torch / transformers (seconds to import): only when it measures
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                      num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                      num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, max_position_embeddings=128,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(spec.seed)
    model = Qwen3ForCausalLM(cfg)
    params = sum(p.numel() for p in model.parameters())
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.key()}-", dir=root))
    model.save_pretrained(str(tmp), safe_serialization=True)
    (tmp / "bench_model.json").write_text(json.dumps({"spec": dataclasses.asdict(spec), "parameters": params}))
    try:
        tmp.rename(path)
    except OSError:  # another process built it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return path, params


def make_batch(samples: int = 8, prompt_len: int = 8, completion_len: int = 24, seed: int = 1234):
    """The same seeded synthetic batch for every configuration: random token ids, plausible
    behaviour log-probs, rewards that differ within each group of 4 (non-zero advantages)."""
    import torch  # (seconds to import): only when a batch is made

    from astraflow.engines.base import TrainBatch, TrainSample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(samples):
        ids = torch.randint(3, VOCAB, (prompt_len + completion_len,), generator=g).tolist()
        logp = (-torch.rand(completion_len, generator=g) * 3 - 0.05).tolist()
        out.append(TrainSample(tuple(ids[:prompt_len]), tuple(ids[prompt_len:]), tuple(logp),
                               reward=float(i % 2), group_id=i // 4))
    return TrainBatch(tuple(out))


# ------------------------------------------------------------------ in each rank


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def _rss_split_mb() -> dict[str, float]:
    """Anonymous vs file-backed RSS (Linux): file pages are the mmap'd checkpoint, clean and
    reclaimable, while anonymous ones are what training allocated."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    kb = {k: float(v.split()[0]) for k, v in (ln.split(":", 1) for ln in lines) if k in ("RssAnon", "RssFile")}
    return {"anon_mb": kb.get("RssAnon", 0) / 1024, "file_mb": kb.get("RssFile", 0) / 1024}


def _weights_digest(trainer) -> str:
    """sha256 over every named weight (all ranks call it: ZeRO-3 gathers collectively)."""
    h = hashlib.sha256()
    for name, t in sorted(trainer.named_weights().items()):
        h.update(name.encode())
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(args: argparse.Namespace) -> int:
    """One rank: build the trainer, warm up, time ``args.steps`` steps, write ``rank<r>.json``."""
    import torch  # torch and DeepSpeed (seconds to import): only in the ranks
    import torch.distributed as dist

    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer

    rank = int(os.environ.get("RANK", 0))
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    t0 = time.perf_counter()
    cfg = TrainerConfig(zero_stage=args.zero, threads=args.threads, token_budget=args.token_budget, lr=1e-5,
                        device=args.device, seed=1, **zero_sizes(args.zero_sizes))
    trainer = DeepSpeedTrainer(args.model, cfg)
    init_s = time.perf_counter() - t0
    rss_init, split_init = _rss_mb(), _rss_split_mb()
    batch = make_batch(args.samples)
    before = _weights_digest(trainer) if args.check else None

    def timed_step() -> tuple[float, float, dict]:
        dist.barrier()
        t, c = time.perf_counter(), time.process_time()
        m = trainer.train_step(batch)
        return time.perf_counter() - t, time.process_time() - c, m

    warmup = timed_step()
    timed = [timed_step() for _ in range(args.steps)]
    rec = {
        "rank": rank, "world": dist.get_world_size(), "init_s": init_s, "warmup_s": warmup[0],
        "step_s": [s for s, _, _ in timed], "cpu_s": [c for _, c, _ in timed],
        "loss": [m["loss"] for _, _, m in [warmup, *timed]], "grad_norm": [m["grad_norm"] for _, _, m in [warmup, *timed]],
        "threads": torch.get_num_threads(), "rss_init_mb": rss_init, "rss_after_mb": _rss_mb(),
        "rss_init_split": split_init, "rss_after_split": _rss_split_mb(),
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if args.device == "cuda":
        rec["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    if args.check:
        after = _weights_digest(trainer)
        rec.update(digest_before=before, digest_after=after)
        bad = [k for k in ("loss", "grad_norm") if not all(math.isfinite(x) for x in rec[k])]
        if bad or before == after:
            raise AssertionError(f"rank {rank}: non-finite {bad}" if bad else f"rank {rank}: the step left the weights unchanged")
    Path(args.out_dir, f"rank{rank}.json").write_text(json.dumps(rec))
    trainer.close()
    return 0


# ------------------------------------------------------------------ the launcher side


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(model: Path, ranks: int, zero: int, *, threads: int, steps: int, samples: int = 8,
           token_budget: int = 4096, device: str = "cpu", check: bool = False, timeout_s: float = 1200,
           sizes: str = "trainer") -> dict:
    """Run one configuration with torch's launcher; return its row (rank records included)."""
    with tempfile.TemporaryDirectory(prefix="af-scaling-") as out_dir:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "--max-restarts", "0",
               "-m", "astraflow.benchmarks.trainer_scaling", "--worker", "--model", str(model), "--zero", str(zero),
               "--threads", str(threads), "--steps", str(steps), "--samples", str(samples),
               "--token-budget", str(token_budget), "--device", device, "--zero-sizes", sizes, "--out-dir", out_dir]
        if check:
            cmd.append("--check")
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        if device == "cpu":
            env["DS_ACCELERATOR"] = "cpu"
        load_before = load_now()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        recs = sorted((json.loads(p.read_text()) for p in Path(out_dir).glob("rank*.json")), key=lambda r: r["rank"])
        if proc.returncode != 0 or len(recs) != ranks:
            tail = (proc.stdout + proc.stderr)[-4000:]
            raise RuntimeError(f"{ranks} rank(s), ZeRO-{zero}: the launcher exited {proc.returncode} with "
                               f"{len(recs)}/{ranks} rank results; last output:\n{tail}")
    # A step takes as long as its slowest rank (they meet in every collective).
    step_s = [max(r["step_s"][i] for r in recs) for i in range(steps)]
    sps = spread([samples / s for s in step_s])
    row = {
        "ranks": ranks, "zero_stage": zero, "threads_per_rank": threads,
        "samples_per_s": sps["median"], "samples_per_s_min": sps["min"], "samples_per_s_max": sps["max"],
        "samples_per_s_spread": sps, "step_s": spread(step_s),
        # CPU seconds the busiest rank spent on a step: what other processes on the box
        # cannot inflate much, unlike wall-clock time (waiting in a collective is not CPU).
        "rank_cpu_s": spread([max(r["cpu_s"][i] for r in recs) for i in range(steps)]),
        "warmup_step_s": max(r["warmup_s"] for r in recs),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in recs),
        "peak_rss_mb_per_rank": [round(r["peak_rss_mb"], 1) for r in recs],
        "rss_after_mb": max(r["rss_after_mb"] for r in recs), "rss_init_mb": max(r["rss_init_mb"] for r in recs),
        "rss_after_anon_mb": max(r["rss_after_split"].get("anon_mb", 0) for r in recs),
        "init_s": max(r["init_s"] for r in recs), "loss": recs[0]["loss"],
        "load_before": load_before, "load_after": load_now(),
    }
    if device == "cuda":
        row["peak_cuda_mb"] = max(r["peak_cuda_mb"] for r in recs)
    if check:
        digests = {r["digest_after"] for r in recs}
        if len(digests) != 1:
            raise AssertionError(f"{ranks} ranks, ZeRO-{zero}: ranks ended with different weights ({len(digests)} digests)")
        row["ranks_agree"] = True
    return row


TABLE = "{:>5} {:>5} {:>22} {:>17} {:>10} {:>14} {:>10} {:>9}"


def print_table(result: dict) -> None:
    m = result["model"]
    print(f"DeepSpeed trainer scaling — {m['name']} ({m['parameters'] / 1e6:.3g} M params, {result['settings']['dtype']}, "
          f"{result['settings']['device']}), batch {result['settings']['samples']} x "
          f"{result['settings']['tokens_per_sample']} tokens, {result['settings']['timed_steps']} timed steps "
          "after 1 warm-up (dropped)")
    print(TABLE.format("ranks", "ZeRO", "samples/s (min-max)", "CPU s/step/rank", "warm-up s", "peak RSS/rank",
                       "RSS after", "load 1m"))
    for r in result["rows"]:
        if "error" in r:
            print(TABLE.format(r["ranks"], r["zero_stage"], "failed", "", "", "", "", ""))
            continue
        print(TABLE.format(r["ranks"], r["zero_stage"], fmt_spread(r["samples_per_s_spread"]),
                           fmt_spread(r["rank_cpu_s"]), f"{r['warmup_step_s']:.1f}", f"{r['peak_rss_mb']:.0f} MB",
                           f"{r['rss_after_mb']:.0f} MB", f"{r['load_after']['loadavg'][0]:.1f}"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny model and 1 timed step (a smoke test)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--zero", type=int, nargs="+", default=[0, 1, 2, 3])
    # 1 thread per rank at every world size: each rank adds one core, so 2 ranks may at
    # best double 1 rank's samples/s on this 2-core box, and no rank oversubscribes it
    # (a 2-thread OpenMP region on a shared box stalls behind other processes).
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 5, --quick 1)")
    ap.add_argument("--samples", type=int, default=8, help="samples per (global) batch")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--check", action="store_true", help="assert finite losses and equal weights on every rank")
    ap.add_argument("--zero-sizes", choices=("trainer", "deepspeed"), default="trainer",
                    help="ZeRO bucket/live-parameter sizes: the trainer config's defaults or DeepSpeed's own")
    ap.add_argument("--model-root", type=Path, default=None, help="cache of benchmark models")
    ap.add_argument("--out", type=Path, default=RESULTS)
    # In-rank flags (set by ``launch``).
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    ap.add_argument("--token-budget", type=int, default=4096, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        args.zero = args.zero[0]
        return worker(args)
    bad = [z for z in args.zero if z not in (0, 1, 2, 3)] + [r for r in args.ranks if r < 1]
    if bad:
        ap.error(f"--zero takes stages 0-3 and --ranks counts >= 1; got {bad}")
    steps = args.steps or (1 if args.quick else 5)
    spec = QUICK if args.quick else FULL
    model, params = ensure_bench_model(spec, args.model_root)
    result = {
        "benchmark": "trainer_scaling",
        "model": {"name": spec.name, "parameters": params, "spec": dataclasses.asdict(spec), "path": str(model)},
        "settings": {"device": args.device, "samples": args.samples, "tokens_per_sample": 32, "timed_steps": steps,
                     "warmup_steps": 1, "threads_per_rank": args.threads, "quick": args.quick, "optimizer": "AdamW",
                     "dtype": "fp32" if args.device == "cpu" else "bf16",
                     "zero_sizes": args.zero_sizes, "zero_optimization": zero_sizes(args.zero_sizes)},
        "trainer_source": _trainer_source(), "uptime_before": _uptime(), "rows": [],
    }
    failed = False
    load_before = load_now()
    # Stage by stage, the world sizes back to back: load from other processes then hits
    # the configurations being compared alike.
    for zero in args.zero:
        for ranks in args.ranks:
            print(f"--- {ranks} rank(s), ZeRO-{zero}", flush=True)
            try:
                row = launch(model, ranks, zero, threads=args.threads, steps=steps, samples=args.samples,
                             device=args.device, check=args.check, sizes=args.zero_sizes)
            except (RuntimeError, AssertionError, subprocess.TimeoutExpired) as err:
                failed = True
                print(f"FAILED: {err}", flush=True)
                row = {"ranks": ranks, "zero_stage": zero, "error": str(err)[-2000:]}
            result["rows"].append(row)
    result["rows"].sort(key=lambda r: (r["ranks"], r["zero_stage"]))
    result["uptime_after"] = _uptime()
    print_table(result)
    write_results(args.out, result, load_before)
    return 1 if failed else 0


def _trainer_source() -> dict:
    """The commit measured, and whether the trainer had uncommitted changes on top of it."""
    root = Path(__file__).resolve().parents[1]
    try:
        git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()  # noqa: E731
        return {"commit": git("rev-parse", "HEAD"), "trainer_modified": bool(git("status", "--porcelain", "engines"))}
    except (OSError, subprocess.SubprocessError):
        return {}


def _uptime() -> str:
    """``uptime``'s line: other processes share these cores, and the load says how much."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import Loader, heading  # noqa: E402 (kept with the tables)


REPORT_TITLE = "Trainer scaling"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``trainer_scaling.json``."""
    d = load("trainer_scaling")
    if not d:
        return []
    m, s = d["model"], d["settings"]
    out = [*heading(REPORT_TITLE),
           f"**Trainer scaling** — `python -m astraflow.benchmarks.trainer_scaling` (DeepSpeed on CPU, gloo, ranks "
           f"started by torch's launcher; random-init Qwen3 of {m['parameters'] / 1e6:.0f} M params, fp32 AdamW; the "
           f"same batch of {s['samples']} × {s['tokens_per_sample']} tokens; {s['threads_per_rank']} torch thread per "
           f"rank; {_report_zero_sizes(s)}; median (min–max) of {s['timed_steps']} steps after a dropped warm-up; "
           f"1-minute load average {d['load']['before']['loadavg'][0]:.1f} → {d['load']['after']['loadavg'][0]:.1f} "
           f"on {d['machine']['cpus']} cores)", "",
           "| ranks | ZeRO | samples/s (min–max) | vs 1 rank | CPU s per step, busiest rank | peak RSS per rank | "
           "RSS after the steps |", "|---:|---:|---:|---:|---:|---:|---:|"]
    one = {r["zero_stage"]: r for r in d["rows"] if r["ranks"] == 1 and "error" not in r}
    for r in d["rows"]:
        if "error" in r:
            out.append(f"| {r['ranks']} | {r['zero_stage']} | failed | | | | |")
            continue
        base = one.get(r["zero_stage"])
        vs = f"{r['samples_per_s'] / base['samples_per_s']:.2f}x" if base else ""
        out.append(f"| {r['ranks']} | {r['zero_stage']} | {r['samples_per_s']:.2f} ({r['samples_per_s_min']:.2f}–"
                   f"{r['samples_per_s_max']:.2f}) | {vs} | {r['rank_cpu_s']['median']:.1f} | {r['peak_rss_mb']:,.0f} MB | "
                   f"{r['rss_after_mb']:,.0f} MB |")
    return out + [""]


def _report_zero_sizes(settings: dict) -> str:
    """Which ZeRO bucket/live-parameter sizes a scaling run used (runs before they were keys: DeepSpeed's)."""
    if settings.get("zero_sizes", "deepspeed") == "deepspeed":
        return "DeepSpeed's default ZeRO buckets (5·10⁸ elements) and live parameters (10⁹)"
    z = settings["zero_optimization"]
    return (f"the trainer's ZeRO sizes ({z['reduce_bucket_size']:.0e}-element buckets, {z['stage3_max_live_parameters']:.0e} "
            f"live parameters, {z['sub_group_size']:.0e}-element sub-groups)").replace("e+0", "e")


if __name__ == "__main__":
    raise SystemExit(main())
