"""Engine throughput: CPU rollout engine vs naive ``transformers.generate``, and trainer speed.

Same model (the bootstrapped tiny Qwen3), same prompts, same sampling parameters and the
**same number of generated tokens per row** on both sides, so tokens/s compares equal
work. The CPU engine samples with fixed per-row seeds, so its row lengths ``L_i`` are the
same in every repetition; the HF side is then made to produce exactly ``L_i`` tokens in
row ``i`` (its stop tokens disabled, a per-row stopping criterion at ``L_i``). HF keeps
computing finished rows until the longest is done — that is how ``generate`` batches,
and part of what the comparison measures. "Naive generate" is what one would write to
get rollouts with logprobs: one batched ``model.generate(do_sample=True,
output_scores=True, return_dict_in_generate=True)`` plus ``compute_transition_scores``.

Each side's first call is reported as ``cold``; then ``--repeats`` calls, alternating the
two sides so load from other processes hits both alike, give median (min–max). The
trainer rows time ``DeepSpeedTrainer.train_step`` on a batch of real rollouts: the first
step cold, then ``--train-steps`` warm steps.

Prints one table; writes ``benchmarks/results/engine_throughput.json``.
Usage: ``python -m astraflow.benchmarks.engine_throughput [--batch 64] [--repeats 5] [--quick]``
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

from astraflow.benchmarks.lib.results import load_now, write_results  # noqa: E402
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "engine_throughput.json"


def row_lengths_criterion(width: int, lengths: list[int]):
    """A ``StoppingCriteria`` that ends row ``i`` after ``lengths[i]`` new tokens."""
    from transformers import StoppingCriteria  # transformers (~1 s to import), here and below: only when it measures

    class RowLengths(StoppingCriteria):
        def __init__(self) -> None:
            self.lengths = torch.tensor(lengths)

        def __call__(self, input_ids, scores, **kwargs):
            return (input_ids.shape[1] - width) >= self.lengths

    return RowLengths()


def naive_generate(model, prompts: list[list[int]], params, pad_id: int, lengths: list[int]) -> int:
    """Batched HF generate with left padding, row ``i`` run to ``lengths[i]`` tokens;
    returns the tokens generated (``sum(lengths)``)."""
    from transformers import StoppingCriteriaList

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    torch.manual_seed(params.seed or 0)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=params.temperature,
            top_p=params.top_p, top_k=params.top_k or None, max_new_tokens=max(lengths), min_new_tokens=0,
            pad_token_id=pad_id, output_scores=True, return_dict_in_generate=True,
            stopping_criteria=StoppingCriteriaList([row_lengths_criterion(width, lengths)]),
        )
        model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    if out.sequences.shape[1] - width != max(lengths):
        raise RuntimeError(f"HF generate stopped after {out.sequences.shape[1] - width} tokens, expected "
                           f"{max(lengths)}: a stop token was not disabled")
    return sum(lengths)


def compare(engine_fn, hf_fn, repeats: int) -> dict:
    """Cold first call of each side, then ``repeats`` alternating warm calls (tokens/s)."""
    def timed(fn) -> tuple[float, int]:
        t0 = time.perf_counter()
        n = fn()
        return time.perf_counter() - t0, n

    (ce_s, ce_n), (ch_s, ch_n) = timed(engine_fn), timed(hf_fn)
    eng, hf = [], []
    for _ in range(repeats):
        eng.append(timed(engine_fn))
        hf.append(timed(hf_fn))
    tokens = {n for _, n in eng + hf} | {ce_n, ch_n}
    if len(tokens) != 1:
        raise RuntimeError(f"the two sides generated different token counts {sorted(tokens)}: not comparable")
    n = tokens.pop()
    e_tps, h_tps = spread([n / s for s, _ in eng]), spread([n / s for s, _ in hf])
    return {"tokens": n, "cold": {"cpu_engine_tok_per_s": ce_n / ce_s, "hf_generate_tok_per_s": ch_n / ch_s},
            "cpu_engine_tok_per_s": e_tps, "hf_generate_tok_per_s": h_tps, "speedup": ratio_spread(e_tps, h_tps)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    # 1 thread: on a shared 2-core box, 2-thread OpenMP regions stall behind other
    # processes and the numbers become noise (measured: 30x swings).
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--train-steps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="batch 16, 3 repeats, 3 train steps (a smoke run)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.repeats, args.train_steps = 16, 3, 3
    if args.repeats < 3:
        ap.error("--repeats must be >= 3 (the tables show median and spread)")
    torch.set_num_threads(args.threads)
    load_before = load_now()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample
    from astraflow.models.bootstrap import ensure_tiny_model
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
    for m in (hf_model, raw_model):
        m.generation_config.eos_token_id = None  # row lengths come from the engine's rollout

    workloads = {
        # Bootstrapped policy on its task: short answers (all rows stop within a few tokens).
        "arith rollout (eos, max 16)": (engine, hf_model, SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=16, stop_token_ids=(eos,), seed=7)),
        # Pure decode: every row runs the full length.
        "decode (no stop, 64 tokens)": (engine, hf_model, SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=64, seed=7)),
        # Long-tailed lengths: rows finish at very different steps.
        "long-tail (random init, max 112)": (raw_engine, raw_model, SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=112, stop_token_ids=tail_stops, seed=7)),
    }
    results: dict = {"benchmark": "engine_throughput", "batch": args.batch, "repeats": args.repeats,
                     "generation": [], "training": []}
    for name, (eng, model, params) in workloads.items():
        lengths = [len(g.tokens) for g in eng.generate(prompts, params)]

        def engine_fn(eng=eng, params=params, lengths=lengths) -> int:
            got = [len(g.tokens) for g in eng.generate(prompts, params)]
            if got != lengths:  # seeded rows: a change means the comparison is no longer fair
                raise RuntimeError(f"{name}: CPU engine row lengths changed between runs")
            return sum(got)

        rec = compare(engine_fn, lambda model=model, params=params, lengths=lengths:
                      naive_generate(model, prompts, params, tok.pad_token_id, lengths), args.repeats)
        rec.update({"workload": name, "batch": args.batch, "row_lengths": {"max": max(lengths), "min": min(lengths)},
                    "params": {k: getattr(params, k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")}})
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
        cold = trainer.train_step(batch)
        steps = [trainer.train_step(batch) for _ in range(args.train_steps)]
        step_s = spread([m["step_seconds"] for m in steps])
        results["training"].append({
            "zero_stage": zero, "samples": len(samples), "tokens": steps[0]["tokens"],
            "micro_batches": steps[0]["micro_batches"], "cold_step_s": cold["step_seconds"], "step_s": step_s,
            "samples_per_s": spread([len(samples) / m["step_seconds"] for m in steps]),
        })
        trainer.close()

    results["env"] = {
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "machine": platform.machine(), "model": str(path.name),
        "parameters": sum(p.numel() for p in hf_model.parameters()),
    }
    print_table(results)
    write_results(args.out, results, load_before)
    return 0


def print_table(results: dict) -> None:
    print(f"{'workload (batch ' + str(results['batch']) + ')':34} {'tokens':>7} {'engine tok/s':>22} "
          f"{'HF generate tok/s':>22} {'speedup':>20}")
    for r in results["generation"]:
        print(f"{r['workload']:34} {r['tokens']:>7} {fmt_spread(r['cpu_engine_tok_per_s'], '.0f'):>22} "
              f"{fmt_spread(r['hf_generate_tok_per_s'], '.0f'):>22} {fmt_spread(r['speedup']):>20}")
    print(f"{'trainer (DeepSpeed, CPU)':34} {'samples':>7} {'warm step s':>22} {'cold step s':>22}")
    for r in results["training"]:
        print(f"{'  ZeRO stage ' + str(r['zero_stage']):34} {r['samples']:>7} {fmt_spread(r['step_s'], '.3f'):>22} "
              f"{r['cold_step_s']:>22.3f}")


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, heading, load_note, fmt_spread as _sp)


REPORT_TITLE = "Rollout engine"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``engine_throughput.json``."""
    d = load("engine_throughput")
    if not d:
        return []
    out = [*heading(REPORT_TITLE),
           "**Rollout engine** — `python -m astraflow.benchmarks.engine_throughput --threads 1` "
           f"(tiny model, {d['env']['parameters']:,} params, {d['env']['threads']} thread; both sides generate the "
           f"same rows to the same lengths, so the same tokens; median (min–max) of {d['repeats']} alternating warm "
           f"calls after a cold one{load_note(d)})", "",
           f"| workload (batch {d['batch']}) | tokens | CPU engine tok/s | `transformers.generate` tok/s | speedup |",
           "|---|---:|---:|---:|---:|"]
    for r in d["generation"]:
        out.append(f"| {r['workload']} | {r['tokens']:,} | {_sp(r['cpu_engine_tok_per_s'], ',.0f')} | "
                   f"{_sp(r['hf_generate_tok_per_s'], ',.0f')} | {_sp(r['speedup'])}x |")
    out += ["", "| DeepSpeed trainer (CPU) | samples/step | warm s/step | cold first step s |", "|---|---:|---:|---:|"]
    for r in d["training"]:
        out.append(f"| ZeRO stage {r['zero_stage']} | {r['samples']} | {_sp(r['step_s'], '.3f')} | {r['cold_step_s']:.3f} |")
    return out + [""]


if __name__ == "__main__":
    raise SystemExit(main())
