"""Engine throughput: CPU rollout engine vs naive ``transformers.generate``, and trainer speed.

Same model (the bootstrapped tiny Qwen3), same prompts, same sampling parameters, side by
side in one run. "Naive generate" is what one would write to get rollouts with logprobs
from ``transformers``: one batched ``model.generate(do_sample=True, output_scores=True,
return_dict_in_generate=True)`` plus ``compute_transition_scores`` for the logprobs.
Generated tokens are counted up to and including the stop token. The trainer rows time
``DeepSpeedTrainer.train_step`` on batches of real rollouts.

Prints one table; writes ``benchmarks/results/engine_throughput.json``.
Usage: ``python -m astraflow.benchmarks.engine_throughput [--batch 64] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "engine_throughput.json"


def naive_generate(model, prompts, params, pad_id):
    """Batched HF generate with left padding; returns the generated token count."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    torch.manual_seed(params.seed or 0)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or None,
            max_new_tokens=params.max_new_tokens,
            min_new_tokens=0,
            eos_token_id=list(params.stop_token_ids) or None,
            pad_token_id=pad_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    gen = out.sequences[:, width:]
    stops = set(params.stop_token_ids)
    count = 0
    for row in gen.tolist():
        for t in row:
            count += 1
            if t in stops:
                break
    return count


def timed_pair(fa, fb, repeats):
    """Median (seconds, tokens) of ``fa`` and ``fb``, run alternately so that load from
    other processes on a shared box hits both sides alike."""
    fa(), fb()  # warm-up
    runs_a, runs_b = [], []
    for _ in range(repeats):
        for fn, runs in ((fa, runs_a), (fb, runs_b)):
            t0 = time.perf_counter()
            n = fn()
            runs.append((time.perf_counter() - t0, n))
    med = lambda runs: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))  # noqa: E731
    return med(runs_a), med(runs_b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    # 1 thread: on a shared 2-core box, 2-thread OpenMP regions stall behind other
    # processes and the numbers become noise (measured: 30x swings).
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--train-steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample
    from astraflow.engines.bootstrap import ensure_tiny_model
    from astraflow.engines.config import TrainerConfig
    from astraflow.engines.cpu import CpuEngine
    from astraflow.workflows.arithmetic import generate_problems, reward

    path = ensure_tiny_model()
    tok = AutoTokenizer.from_pretrained(str(path))
    engine = CpuEngine(path)
    hf_model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    problems = generate_problems(args.batch, seed=1234)
    prompts = [tok.encode(p.prompt, add_special_tokens=False) for p in problems]
    eos = tok.eos_token_id

    # Same architecture, random init: a policy that has not learned to stop, so lengths
    # have the long tail real RL rollouts have (stop on <eos>, '.' or '!').
    torch.manual_seed(0)
    raw_model = type(hf_model)(hf_model.config).eval()
    raw_engine = CpuEngine(raw_model)
    tail_stops = (eos, *tok.convert_tokens_to_ids([".", "!"]))

    workloads = {
        # Bootstrapped policy on its task: short answers (all rows stop within a few tokens).
        "arith rollout (eos, max 16)": (engine, hf_model, SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=16, stop_token_ids=(eos,), seed=7)),
        # Pure decode: every row runs the full length.
        "decode (no stop, 64 tokens)": (engine, hf_model, SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=64, seed=7)),
        # Long-tailed lengths: rows finish at very different steps.
        "long-tail (random init, max 112)": (raw_engine, raw_model, SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=112, stop_token_ids=tail_stops, seed=7)),
    }
    results = {"generation": [], "training": []}
    for name, (eng, model, params) in workloads.items():
        (e_s, e_n), (h_s, h_n) = timed_pair(
            lambda: sum(len(g.tokens) for g in eng.generate(prompts, params)),
            lambda: naive_generate(model, prompts, params, tok.pad_token_id),
            args.repeats,
        )
        rec = {
            "workload": name, "batch": args.batch, "params": {k: getattr(params, k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")},
            "cpu_engine_s": e_s, "cpu_engine_tokens": e_n, "cpu_engine_tok_per_s": e_n / e_s,
            "hf_generate_s": h_s, "hf_generate_tokens": h_n, "hf_generate_tok_per_s": h_n / h_s,
        }
        rec["speedup"] = rec["cpu_engine_tok_per_s"] / rec["hf_generate_tok_per_s"]
        results["generation"].append(rec)

    # Trainer: batches of real rollouts (groups of 8 per prompt).
    from astraflow.engines.deepspeed_trainer import DeepSpeedTrainer

    group = 8
    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(eos,), seed=3)
    rollouts = engine.generate([p for p in prompts[: args.batch // group] for _ in range(group)], params)
    samples = tuple(
        TrainSample(g.prompt_ids, g.tokens, g.logprobs,
                    reward=reward(tok.decode(g.tokens, skip_special_tokens=True), problems[i // group].answer), group_id=i // group)
        for i, g in enumerate(rollouts)
    )
    batch = TrainBatch(samples)
    for zero in (0, 2):
        trainer = DeepSpeedTrainer(path, TrainerConfig(lr=1e-5, zero_stage=zero, token_budget=1024))
        trainer.train_step(batch)  # warm-up
        steps = [trainer.train_step(batch) for _ in range(args.train_steps)]
        secs = statistics.median(m["step_seconds"] for m in steps)
        results["training"].append({
            "zero_stage": zero, "samples": len(samples), "tokens": steps[0]["tokens"],
            "micro_batches": steps[0]["micro_batches"], "step_s": secs, "samples_per_s": len(samples) / secs,
        })
        trainer.close()

    results["env"] = {
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "machine": platform.machine(), "python": platform.python_version(), "model": str(path.name),
        "parameters": sum(p.numel() for p in hf_model.parameters()),
        "loadavg_after": os.getloadavg(),
    }

    print(f"{'workload (batch ' + str(args.batch) + ')':34} {'engine tok/s':>13} {'HF generate tok/s':>18} {'speedup':>8}")
    for r in results["generation"]:
        print(f"{r['workload']:34} {r['cpu_engine_tok_per_s']:13.0f} {r['hf_generate_tok_per_s']:18.0f} {r['speedup']:7.2f}x")
    print(f"{'trainer (DeepSpeed, CPU)':34} {'samples/step':>13} {'step s':>18} {'samples/s':>8}")
    for r in results["training"]:
        print(f"{'  ZeRO stage ' + str(r['zero_stage']):34} {r['samples']:13d} {r['step_s']:18.3f} {r['samples_per_s']:8.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
