"""Weight transfer over Kafka: delta sizes from real RL steps, codec throughput, latency.

One run, one table:

(a) real deltas: GRPO steps of the DeepSpeed CPU trainer on the tiny model, with
    rollouts from the CPU engine on the arithmetic task. Per step: the changed fraction,
    delta bytes against full-snapshot bytes, and against the entropy bound for that many
    changed positions (log2 C(n, k) bits + the raw new values). Both as the CPU trainer
    hands them over (fp32) and cast to bf16 (what a bf16 inference engine receives);
(b) a synthetic bf16 model (1 B parameters by default) with 1 % of elements changed:
    delta encode and decode+apply throughput in GB/s of model weights, next to
    ``numpy.copyto`` bandwidth on the same bytes (functions of ``codec_throughput.py``);
(c) publish -> every subscriber holds the verified version, through a real broker, for
    the tiny model and the synthetic model: a delta step vs a full snapshot (a cold
    publisher, so subscribers take the snapshot path).

    python -m astraflow.benchmarks.weight_transfer                 # 1 B parameters
    python -m astraflow.benchmarks.weight_transfer --params 1e8    # quick run

Writes benchmarks/results/weight_transfer.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import resource
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from astraflow.benchmarks.results_io import write_results
from astraflow.actors.weights import WeightPublisher, WeightSubscriber
from astraflow.benchmarks.codec_throughput import make_model, make_step, memcpy_gbps, timed
from astraflow.engines import deltas
from astraflow.topics import EmbeddedBroker, JobTopics, ensure_topics

RESULTS = Path(__file__).resolve().parent / "results" / "weight_transfer.json"
GB = 1e9


# ---------------------------------------------------------------- (a) real RL deltas


def rl_steps(steps: int, prompts: int, samples: int, seed: int) -> tuple[list[dict[str, torch.Tensor]], dict[str, Any]]:
    """Weights after each of ``steps`` on-policy GRPO steps (index 0: before the first)."""
    from transformers import AutoTokenizer

    from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample
    from astraflow.engines.cpu import CpuEngine
    from astraflow.engines.factory import make_train_engine, resolve_model_path
    from astraflow.workflows import arithmetic

    path = resolve_model_path("", seed)
    trainer = make_train_engine({"device": "cpu", "seed": seed, "threads": os.cpu_count() or 1})
    engine = CpuEngine(path)
    tok = AutoTokenizer.from_pretrained(str(path))
    problems = arithmetic.generate_problems(steps * prompts, seed=seed)
    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(tok.eos_token_id,))
    weights, rewards = [trainer.named_weights()], []
    for step in range(steps):
        batch_problems = problems[step * prompts:(step + 1) * prompts]
        rows = [tok.encode(p.prompt, add_special_tokens=False) for p in batch_problems for _ in range(samples)]
        gens = engine.generate(rows, dataclasses.replace(params, seed=seed + step))
        train = []
        for i, g in enumerate(gens):
            p = batch_problems[i // samples]
            r = arithmetic.reward(tok.decode(list(g.tokens), skip_special_tokens=True), p.answer)
            rewards.append(r)
            train.append(TrainSample(tuple(g.prompt_ids), tuple(g.tokens), tuple(g.logprobs), r, group_id=i // samples))
        trainer.train_step(TrainBatch(tuple(train), step=step))
        weights.append(trainer.named_weights())
        engine.load_weights(weights[-1], step + 1)
    trainer.close()
    engine.close()
    info = {"trainer": type(trainer).__name__, "model": str(path), "steps": steps,
            "rollouts_per_step": prompts * samples, "reward_mean": float(np.mean(rewards)),
            "params": sum(t.numel() for t in weights[0].values())}
    return weights, info


def delta_sizes(weights: list[dict[str, torch.Tensor]], dtype: torch.dtype | None) -> dict[str, Any]:
    """Per step: changed fraction, delta/snapshot bytes, delta/entropy bound."""
    seq = [{k: v.to(dtype) for k, v in w.items()} if dtype is not None else w for w in weights]
    snap = deltas.encode_version(seq[-1], len(seq) - 1)
    per_step = []
    for v in range(1, len(seq)):
        ev = deltas.encode_version(seq[v], v, base=seq[v - 1], base_version=v - 1)
        per_step.append({"version": v, "changed_fraction": ev.stats.changed_fraction, "delta_bytes": ev.nbytes,
                         "entropy_bound_bytes": ev.stats.entropy_bound_nbytes,
                         "encodings": sorted({e.value for e in ev.stats.encodings.values()})})
    return {"dtype": str(next(iter(seq[0].values())).dtype).removeprefix("torch."), "snapshot_bytes": snap.nbytes,
            "raw_bytes": snap.stats.raw_nbytes, "steps": per_step,
            "changed_fraction": statistics.median(s["changed_fraction"] for s in per_step),
            "delta_over_snapshot": statistics.median(s["delta_bytes"] / snap.nbytes for s in per_step),
            "delta_over_entropy_bound": statistics.median(s["delta_bytes"] / s["entropy_bound_bytes"]
                                                          for s in per_step)}


# ---------------------------------------------------------------- (b) codec throughput


def codec_throughput(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor], threads: int) -> dict[str, Any]:
    gb = sum(t.numel() * t.element_size() for t in base.values()) / GB
    base_hashes = deltas.tensor_hashes(base, threads)  # the publisher keeps these from the last version
    t_enc, ev = timed(lambda: deltas.encode_version(new, 1, base=base, base_version=0,
                                                    base_hashes=base_hashes, threads=threads))
    payload, stats = ev.to_bytes(), ev.stats
    del ev
    live = {k: v.clone() for k, v in base.items()}
    t_apply, _ = timed(lambda: deltas.apply_in_place(payload, live, base_hashes=base_hashes, threads=threads))
    del live
    return {"memcpy_gbps": memcpy_gbps(base, repeats=3), "delta_encode_gbps": gb / t_enc,
            "delta_apply_gbps": gb / t_apply, "changed_fraction": stats.changed_fraction,
            "delta_bytes": len(payload), "threads": threads}


# ---------------------------------------------------------------- (c) latency through Kafka


def transfer_latency(bootstrap: str, label: str, version: Callable[[int], Mapping[str, torch.Tensor]], count: int,
                     subscribers: int, threads: int) -> dict[str, Any]:
    """Seconds from ``publish()`` until every subscriber holds the version.

    Version 0 goes out from a cold publisher (a full snapshot; subscribers start empty and
    take the snapshot path); versions 1..count-1 are deltas that followers apply in place.
    ``version(v)`` makes the weights of version v when they are needed (saves RAM).
    """
    topics = JobTopics(job=f"wt{label}{uuid.uuid4().hex[:6]}", policies=("policy",), task_partitions=1,
                       trajectory_partitions=1)
    ensure_topics(bootstrap, topics.specs())
    pub = WeightPublisher(bootstrap, topics, "policy", snapshot_every=1 << 30, queue_size=1,
                          codec_threads=threads)
    subs = [WeightSubscriber(bootstrap, topics, "policy", node_id=f"{label}-{i}",
                             codec_threads=max(1, threads // subscribers)).start() for i in range(subscribers)]
    full, delta, named = None, [], {}
    try:
        for v in range(count):
            named = version(v)
            t0 = time.perf_counter()
            pub.publish(named, v)
            for s in subs:
                if not s.wait_for(v, 900):
                    raise TimeoutError(f"{s.node_id} did not reach version {v}: {s.faults}")
            took = time.perf_counter() - t0
            if v == 0:
                full = took
            else:
                delta.append(took)
            pub.flush(60)
        digest = deltas.weights_digest(named)
        assert all(s.digest() == digest for s in subs), "a subscriber does not hold the trainer's bits"
        assert all(not s.faults for s in subs), [s.faults for s in subs]
        by_kind = {p.kind: p for p in pub.published}  # the last of each kind
    finally:
        for s in subs:
            s.close()
        pub.close()
    snap, dl = by_kind["snapshot"], by_kind["delta"]
    return {"subscribers": subscribers, "full_s": full, "delta_s": statistics.median(delta),
            "delta_runs": len(delta), "full_bytes": snap.payload_bytes, "delta_bytes": dl.payload_bytes,
            "full_encode_s": snap.encode_s, "full_write_s": snap.write_s,
            "delta_encode_s": dl.encode_s, "delta_write_s": dl.write_s}


# ---------------------------------------------------------------- main


def rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def print_table(r: dict[str, Any]) -> None:
    rl, syn = r["rl"], r["synthetic"]
    rows: list[tuple[str, str]] = [
        ("RL steps", f"{rl['info']['steps']} GRPO steps, {rl['info']['trainer']} (CPU, fp32), "
                     f"{rl['info']['params'] / 1e6:.2f} M params, {rl['info']['rollouts_per_step']} rollouts/step"),
    ]
    for d in (rl["fp32"], rl["bf16"]):
        rows += [
            (f"  {d['dtype']}: changed per step (median)", f"{d['changed_fraction']:.2%}  "
             f"[{', '.join(format(s['changed_fraction'], '.1%') for s in d['steps'])}]"),
            (f"  {d['dtype']}: delta / full snapshot", f"{d['delta_over_snapshot']:.3f}  "
             f"(snapshot {d['snapshot_bytes'] / 1e6:.2f} MB, raw {d['raw_bytes'] / 1e6:.2f} MB)"),
            (f"  {d['dtype']}: delta / entropy bound", f"{d['delta_over_entropy_bound']:.3f}"),
        ]
    rows += [
        ("synthetic model", f"{syn['params'] / 1e9:.2f} B params bf16, {syn['changed_fraction']:.2%} changed, "
                            f"{syn['threads']} threads"),
        ("  memcpy (numpy.copyto)", f"{syn['memcpy_gbps']:.2f} GB/s"),
        ("  delta encode", f"{syn['delta_encode_gbps']:.2f} GB/s of weights "
                           f"({syn['delta_encode_gbps'] / syn['memcpy_gbps']:.1%} of memcpy)"),
        ("  delta decode+apply (verified)", f"{syn['delta_apply_gbps']:.2f} GB/s of weights "
                                            f"({syn['delta_apply_gbps'] / syn['memcpy_gbps']:.1%} of memcpy)"),
    ]
    for key, name in (("tiny", "tiny model"), ("big", "synthetic model")):
        lat = r["latency"][key]
        rows += [
            (f"publish -> {lat['subscribers']} subscribers hold it, {name}",
             f"delta {lat['delta_s']:.2f} s ({lat['delta_bytes'] / 1e6:.2f} MB) | "
             f"full {lat['full_s']:.2f} s ({lat['full_bytes'] / 1e6:.1f} MB)"),
            ("  of which publisher encode | write+ack",
             f"delta {lat['delta_encode_s']:.2f} | {lat['delta_write_s']:.2f} s, "
             f"full {lat['full_encode_s']:.2f} | {lat['full_write_s']:.2f} s"),
        ]
    rows.append(("peak RSS (publisher + subscribers + models)", f"{r['peak_rss_gb']:.1f} GB"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=1e9, help="synthetic model size (default 1e9)")
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--fraction", type=float, default=0.01, help="share of synthetic elements changed")
    ap.add_argument("--rl-steps", type=int, default=6)
    ap.add_argument("--subscribers", type=int, default=3, help="subscribers for the tiny model")
    ap.add_argument("--big-subscribers", type=int, default=2,
                    help="subscribers for the synthetic model (each holds a copy: mind RAM)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--bootstrap-servers")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    r: dict[str, Any] = {}

    weights, info = rl_steps(args.rl_steps, prompts=8, samples=4, seed=0)
    r["rl"] = {"info": info, "fp32": delta_sizes(weights, None), "bf16": delta_sizes(weights, torch.bfloat16)}

    base = make_model(int(args.params), args.tensors, seed=0)
    new = make_step(base, args.fraction, "random", seed=1)
    r["synthetic"] = {"params": sum(t.numel() for t in base.values()), "tensors": args.tensors,
                      **codec_throughput(base, new, args.threads)}
    del new  # made again (same seed) once the snapshot phase is over: keeps peak RSS down
    gc.collect()

    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers or stack.enter_context(EmbeddedBroker(heap="1g")).bootstrap_servers
        r["latency"] = {
            "tiny": transfer_latency(bootstrap, "tiny", weights.__getitem__, len(weights), args.subscribers,
                                     args.threads),
            "big": transfer_latency(bootstrap, "big",
                                    lambda v: base if v == 0 else make_step(base, args.fraction, "random", seed=v),
                                    2, args.big_subscribers, args.threads),
        }
    r["peak_rss_gb"] = rss_gb()
    r["machine"] = {"torch": torch.__version__, "numpy": np.__version__}
    print_table(r)
    write_results(args.out, r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
