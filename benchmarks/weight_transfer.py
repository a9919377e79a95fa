"""Weight transfer over Kafka: delta sizes from real RL steps, codec throughput, latency.

One run, one table:

(a) real deltas: GRPO steps of the DeepSpeed CPU trainer on the tiny model, with
    rollouts from the CPU engine on the arithmetic task. Per step: the changed fraction,
    delta bytes against full-snapshot bytes, and against an empirical entropy estimate
    of the change mask and the new values (``codec_throughput.entropy_estimate``: an
    estimate, not a bound — zstd may beat it). Both as the CPU trainer hands them over
    (fp32) and cast to bf16 (what a bf16 inference engine receives);
(b) a synthetic bf16 model (1 B parameters by default) with 1 % of elements changed:
    ``codec_throughput.delta_codec`` — memcpy with the codec's thread count, delta
    encode and decode+apply, repeated and paired run by run (``encode_vs_memcpy``,
    ``decode_vs_memcpy``);
(c) publish -> every subscriber holds the verified version, through a real broker, for
    the tiny model and the synthetic model: a full snapshot (a cold publisher, so
    subscribers take the snapshot path) then deltas, ``--repeats`` times on fresh
    topics. ``snapshot_e2e_MBps`` is the snapshot's payload bytes over that time with one
    subscriber (the headline: Kafka's consumer tool is one consumer too; a fan-out row
    has ``--big-subscribers``); ``kafka_tool_consume_MBps`` is ``kafka-consumer-perf-test``
    reading the very same chunk records from the same broker right after each round, and
    ``kafka_tool_produce_MBps`` is ``kafka-producer-perf-test`` writing as many 1 MiB
    records with the publisher's settings, also after each round. A version is announced
    only once durable, so publish -> applied is at best the tools' produce time plus their
    consume time (``kafka_tools_in_series_MBps``). The ratios are paired within each round,
    then their median and spread reported (``*_paired``).

    python -m astraflow.benchmarks.weight_transfer                 # 1 B parameters
    python -m astraflow.benchmarks.weight_transfer --quick         # 1e8, a smoke run

Writes benchmarks/results/weight_transfer.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import resource
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from astraflow.benchmarks.codec_throughput import delta_codec, entropy_estimate, make_model, make_step
from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.stats import fmt_spread, spread
from astraflow.benchmarks.lib.table import print_pairs
from astraflow.benchmarks.topics_throughput import perf_consumer, perf_producer
from astraflow.topics import EmbeddedBroker, JobTopics, TopicSpec, ensure_topics
from astraflow.topics.chunking import DEFAULT_CHUNK_SIZE
from astraflow.weights import WeightPublisher, WeightSubscriber, codec

RESULTS = Path(__file__).resolve().parent / "results" / "weight_transfer.json"
GB, MB = 1e9, 1e6


# ---------------------------------------------------------------- (a) real RL deltas


def rl_steps(steps: int, prompts: int, samples: int, seed: int) -> tuple[list[dict[str, torch.Tensor]], dict[str, Any]]:
    """Weights after each of ``steps`` on-policy GRPO steps (index 0: before the first)."""
    from transformers import AutoTokenizer  # transformers and the engines (~1 s to import): only for the RL rows

    from astraflow.engines.base import SamplingParams, TrainBatch, TrainSample
    from astraflow.engines.cpu import CpuEngine
    from astraflow.engines.factory import make_train_engine
    from astraflow.models.bootstrap import resolve_model_path
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
    """Per step: changed fraction, delta/snapshot bytes, delta/entropy estimate (spreads over steps)."""
    seq = [{k: v.to(dtype) for k, v in w.items()} if dtype is not None else w for w in weights]
    snap = codec.encode_version(seq[-1], len(seq) - 1)
    per_step = []
    for v in range(1, len(seq)):
        ev = codec.encode_version(seq[v], v, base=seq[v - 1], base_version=v - 1)
        est = entropy_estimate(seq[v - 1], seq[v])
        per_step.append({"version": v, "changed_fraction": ev.stats.changed_fraction, "delta_bytes": ev.nbytes,
                         "entropy_estimate_bytes": est["bytes"], "entropy_estimate_mask_bytes": est["mask_bytes"],
                         "encodings": sorted({t.label for t in ev.stats.tensors})})
    return {"dtype": str(next(iter(seq[0].values())).dtype).removeprefix("torch."), "snapshot_bytes": snap.nbytes,
            "raw_bytes": snap.stats.raw_nbytes, "steps": per_step,
            "changed_fraction": spread([s["changed_fraction"] for s in per_step]),
            "delta_over_snapshot": spread([s["delta_bytes"] / snap.nbytes for s in per_step]),
            "delta_over_entropy_estimate": spread([s["delta_bytes"] / s["entropy_estimate_bytes"] for s in per_step])}


# ---------------------------------------------------------------- (c) latency through Kafka


def transfer_latency(bootstrap: str, label: str, version: Callable[[int], Mapping[str, torch.Tensor]], count: int,
                     subscribers: int, threads: int, repeats: int, *, with_tools: bool = False) -> dict[str, Any]:
    """Seconds from ``publish()`` until every subscriber holds the version, ``repeats`` times.

    Each repetition uses fresh topics, a cold publisher and empty subscribers: version 0
    goes out as a full snapshot (subscribers take the snapshot path), versions
    1..count-1 as deltas that they apply in place. ``version(v)`` makes the weights of
    version v when they are needed (saves RAM). The last repetition's weights topic is
    left for :func:`kafka_tool_consume`.

    ``with_tools``: right after each repetition, Kafka's consumer tool reads that
    repetition's chunk records and its producer tool writes as many 1 MiB records, so each
    ratio of the snapshot's rate to the tools' is paired within one repetition (this machine's
    write rate drifts by 2x and more between minutes; a ratio of medians taken minutes apart
    would carry that drift).

    Every round, and every run of the producer tool, starts once the machine's dirty pages
    are written back (``os.sync()``, untimed): this VM's disk sustains only ~80–120 MB/s of
    buffered writes (``dd ... conv=fdatasync``, 4 GB), so once earlier rounds' gigabytes fill
    the kernel's dirty-page allowance every writer — the broker for us and for Kafka's
    producer tool alike — is throttled to the disk, and later rounds measured that instead
    (producer tool 187 → 97 MB/s within one run).
    """
    runs = []
    for _ in range(repeats):
        _write_back()
        run = _transfer_once(bootstrap, label, version, count, subscribers, threads)
        if with_tools:
            run["tool_consume_MBps"] = _tool_consume_once(bootstrap, run["weights_topic"], run["weights_records"])
            run["tool_produce_MBps"] = _tool_produce_once(bootstrap, run["full_bytes"])
        runs.append(run)
    result = _latency_summary(runs, subscribers, repeats)
    if with_tools:
        snap = result["snapshot_e2e_MBps"]["runs"]
        cons = [r["tool_consume_MBps"] for r in runs]
        prod = [r["tool_produce_MBps"] for r in runs]
        series = [1 / (1 / p + 1 / c) for p, c in zip(prod, cons)]
        result["tools"] = {
            "consume": {"topic": runs[-1]["weights_topic"], "records": runs[-1]["weights_records"],
                        "MBps": spread(cons)},
            "produce": {"records": _tool_records(runs[-1]["full_bytes"]), "record_bytes": DEFAULT_CHUNK_SIZE,
                        "MBps": spread(prod)},
            "in_series_MBps": spread(series),
            "snapshot_vs_consume": spread([a / b for a, b in zip(snap, cons)]),
            "snapshot_vs_in_series": spread([a / b for a, b in zip(snap, series)]),
        }
    return result


def _latency_summary(runs: list[dict[str, Any]], subscribers: int, repeats: int) -> dict[str, Any]:
    snap_bytes = runs[-1]["full_bytes"]
    return {"subscribers": subscribers, "repeats": repeats, "full_s": spread([r["full_s"] for r in runs]),
            "delta_s": spread([s for r in runs for s in r["delta_s"]]),
            "full_bytes": snap_bytes, "raw_bytes": runs[-1]["raw_bytes"], "delta_bytes": runs[-1]["delta_bytes"],
            "snapshot_e2e_MBps": spread([r["full_bytes"] / r["full_s"] / MB for r in runs]),
            "snapshot_e2e_raw_MBps": spread([r["raw_bytes"] / r["full_s"] / MB for r in runs]),
            "full_encode_s": spread([r["full_encode_s"] for r in runs]),
            "full_write_s": spread([r["full_write_s"] for r in runs]),
            "delta_encode_s": spread([r["delta_encode_s"] for r in runs]),
            "delta_write_s": spread([r["delta_write_s"] for r in runs]),
            "weights_topic": runs[-1]["weights_topic"], "weights_records": runs[-1]["weights_records"],
            "weights_topic_bytes": runs[-1]["weights_topic_bytes"]}


def _transfer_once(bootstrap: str, label: str, version: Callable[[int], Mapping[str, torch.Tensor]], count: int,
                   subscribers: int, threads: int) -> dict[str, Any]:
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
        digest = codec.weights_digest(named)
        assert all(s.digest() == digest for s in subs), "a subscriber does not hold the trainer's bits"
        assert all(not s.faults for s in subs), [s.faults for s in subs]
        published = list(pub.published)
    finally:
        for s in subs:
            s.close()
        pub.close()
    by_kind = {p.kind: p for p in published}  # the last of each kind
    snap, dl = by_kind["snapshot"], by_kind.get("delta")
    return {"full_s": full, "delta_s": delta, "full_bytes": snap.payload_bytes, "raw_bytes": snap.stats.raw_nbytes,
            "delta_bytes": dl.payload_bytes if dl else None, "full_encode_s": snap.encode_s,
            "full_write_s": snap.write_s, "delta_encode_s": dl.encode_s if dl else 0.0,
            "delta_write_s": dl.write_s if dl else 0.0, "weights_topic": topics.weights("policy"),
            "weights_records": sum(p.chunks for p in published),
            "weights_topic_bytes": sum(p.payload_bytes for p in published)}


def _write_back() -> None:
    """Write dirty pages back before a timed write, so each starts from the same state."""
    os.sync()


def _tool_consume_once(bootstrap: str, topic: str, records: int) -> float:
    """``kafka-consumer-perf-test`` reading ``records`` records of ``topic``: MB/s."""
    r = perf_consumer(bootstrap, topic, records)
    return r["bytes"] / r["seconds"] / MB


def _tool_records(payload_bytes: int) -> int:
    return max(1, payload_bytes // DEFAULT_CHUNK_SIZE)


def _tool_produce_once(bootstrap: str, payload_bytes: int) -> float:
    """``kafka-producer-perf-test`` writing as many 1 MiB records as ``payload_bytes`` fill, with
    the publisher's settings (acks=all, idempotent, uncompressed), to a fresh topic: MB/s."""
    topic = f"af.wtprod{uuid.uuid4().hex[:6]}"
    ensure_topics(bootstrap, [TopicSpec(topic, 1, max_message_bytes=4 * 1024 * 1024)])
    _write_back()
    r = perf_producer(bootstrap, topic, _tool_records(payload_bytes), DEFAULT_CHUNK_SIZE, None,
                      {"acks": "all", "enable.idempotence": "true", "compression.type": "none",
                       "max.request.size": str(4 * 1024 * 1024), "linger.ms": "0"})
    return r["records_per_s"] * DEFAULT_CHUNK_SIZE / MB


def kafka_tool_consume(bootstrap: str, latency: dict[str, Any], repeats: int) -> dict[str, Any]:
    """``kafka-consumer-perf-test`` reading the weights topic the last transfer wrote."""
    runs = [_tool_consume_once(bootstrap, latency["weights_topic"], latency["weights_records"])
            for _ in range(repeats)]
    return {"topic": latency["weights_topic"], "records": latency["weights_records"], "MBps": spread(runs)}


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
            (f"  {d['dtype']}: changed per step", f"{fmt_spread(d['changed_fraction'], '.1%')}"),
            (f"  {d['dtype']}: delta / full snapshot", f"{fmt_spread(d['delta_over_snapshot'], '.3f')}  "
             f"(snapshot {d['snapshot_bytes'] / 1e6:.2f} MB, raw {d['raw_bytes'] / 1e6:.2f} MB)"),
            (f"  {d['dtype']}: delta / entropy estimate", fmt_spread(d["delta_over_entropy_estimate"], ".3f")),
        ]
    rows += [
        ("synthetic model", f"{syn['params'] / 1e9:.2f} B params bf16, {syn['changed_fraction']:.2%} changed, "
                            f"{syn['threads']} threads, {syn['repeats']} rounds"),
        (f"  memcpy (numpy.copyto, {syn['threads']} threads)", f"{fmt_spread(syn['memcpy_gbps'])} GB/s"),
        ("  delta encode", f"{fmt_spread(syn['delta_encode_gbps'])} GB/s of weights "
                           f"(vs memcpy {fmt_spread(syn['encode_vs_memcpy'], '.3f')})"),
        ("  delta decode+apply (verified)", f"{fmt_spread(syn['delta_apply_gbps'])} GB/s of weights "
                                            f"(vs memcpy {fmt_spread(syn['decode_vs_memcpy'], '.3f')})"),
    ]
    for key, name in (("tiny", "tiny model"), ("big", "synthetic model"), ("big_fanout", "synthetic model")):
        lat = r["latency"][key]
        rows += [
            (f"publish -> {lat['subscribers']} subscribers hold it, {name}",
             f"delta {fmt_spread(lat['delta_s'])} s ({lat['delta_bytes'] / 1e6:.2f} MB) | "
             f"full {fmt_spread(lat['full_s'])} s ({lat['full_bytes'] / 1e6:.1f} MB)"),
            ("  of which publisher encode | write+ack (median)",
             f"delta {lat['delta_encode_s']['median']:.2f} | {lat['delta_write_s']['median']:.2f} s, "
             f"full {lat['full_encode_s']['median']:.2f} | {lat['full_write_s']['median']:.2f} s"),
            ("  snapshot end to end", f"{fmt_spread(lat['snapshot_e2e_MBps'], '.1f')} MB/s of payload"),
        ]
    k, kp = r["kafka_tool_consume"], r["kafka_tool_produce"]
    rows += [(f"kafka-consumer-perf-test on each round's {k['records']} chunk records", f"{fmt_spread(k['MBps'], '.1f')} MB/s"),
             (f"kafka-producer-perf-test, {kp['records']} records of 1 MiB", f"{fmt_spread(kp['MBps'], '.1f')} MB/s"),
             ("snapshot end to end / Kafka consumer tool (paired per round)",
              fmt_spread(r["snapshot_e2e_vs_kafka_tool_paired"], ".3f")),
             ("snapshot end to end / the tools in series (produce, then consume; paired)",
              fmt_spread(r["snapshot_e2e_vs_kafka_tools_in_series_paired"], ".3f")),
             ("peak RSS (publisher + subscribers + models)", f"{r['peak_rss_gb']:.1f} GB")]
    print_pairs(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=1e9, help="synthetic model size (default 1e9)")
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--fraction", type=float, default=0.01, help="share of synthetic elements changed")
    ap.add_argument("--rl-steps", type=int, default=6)
    ap.add_argument("--subscribers", type=int, default=3, help="subscribers for the tiny model")
    ap.add_argument("--big-subscribers", type=int, default=2,
                    help="subscribers of the synthetic model's fan-out row (each holds a copy: mind RAM); "
                         "the headline row has one, like the Kafka consumer tool it is compared with")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1e8 parameters, 3 RL steps (a smoke run)")
    ap.add_argument("--bootstrap-servers")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.params, args.rl_steps = min(args.params, 1e8), min(args.rl_steps, 3)
    if args.repeats < 3:
        ap.error("--repeats must be >= 3 (the tables show median and spread)")
    load_before = load_now()
    r: dict[str, Any] = {"benchmark": "weight_transfer", "repeats": args.repeats}

    weights, info = rl_steps(args.rl_steps, prompts=8, samples=4, seed=0)
    r["rl"] = {"info": info, "fp32": delta_sizes(weights, None), "bf16": delta_sizes(weights, torch.bfloat16)}

    base = make_model(int(args.params), args.tensors, seed=0)
    new = make_step(base, args.fraction, "random", seed=1)
    r["synthetic"] = {"params": sum(t.numel() for t in base.values()), "tensors": args.tensors,
                      **delta_codec(base, new, args.threads, args.repeats)}
    del new  # made again (same seed) once the snapshot phase is over: keeps peak RSS down
    gc.collect()

    def big_version(v: int) -> Mapping[str, torch.Tensor]:  # version 0 is the base, then one step each
        return base if v == 0 else make_step(base, args.fraction, "random", seed=v)

    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers or stack.enter_context(EmbeddedBroker(heap="1g")).bootstrap_servers
        r["latency"] = {
            "tiny": transfer_latency(bootstrap, "tiny", weights.__getitem__, len(weights), args.subscribers,
                                     args.threads, args.repeats),
            "big": transfer_latency(bootstrap, "big", big_version, 2, 1, args.threads, args.repeats, with_tools=True),
            "big_fanout": transfer_latency(bootstrap, "bigfan", big_version, 2, args.big_subscribers, args.threads,
                                           args.repeats),
        }
        tools = r["latency"]["big"].pop("tools")
        r["kafka_tool_consume"], r["kafka_tool_produce"] = tools["consume"], tools["produce"]
    big, syn = r["latency"]["big"], r["synthetic"]
    # The headline numbers, each from this run (medians; the spreads are above).
    r["snapshot_e2e_MBps"] = big["snapshot_e2e_MBps"]["median"]
    r["kafka_tool_consume_MBps"] = r["kafka_tool_consume"]["MBps"]["median"]
    # Ratios paired within each repetition (the tools ran right after it), then the median.
    r["snapshot_e2e_vs_kafka_tool_paired"] = tools["snapshot_vs_consume"]
    r["snapshot_e2e_vs_kafka_tool"] = tools["snapshot_vs_consume"]["median"]
    # Publish -> applied includes writing: the tools' own produce-then-consume time is the
    # fair ceiling for a path that announces a version only once it is durable.
    r["kafka_tool_produce_MBps"] = r["kafka_tool_produce"]["MBps"]["median"]
    r["kafka_tools_in_series"] = tools["in_series_MBps"]
    r["kafka_tools_in_series_MBps"] = tools["in_series_MBps"]["median"]
    r["snapshot_e2e_vs_kafka_tools_in_series_paired"] = tools["snapshot_vs_in_series"]
    r["snapshot_e2e_vs_kafka_tools_in_series"] = tools["snapshot_vs_in_series"]["median"]
    r["encode_vs_memcpy"] = syn["encode_vs_memcpy"]["median"]
    r["decode_vs_memcpy"] = syn["decode_vs_memcpy"]["median"]
    r["peak_rss_gb"] = rss_gb()
    r["machine"] = {"torch": torch.__version__, "numpy": np.__version__}
    print_table(r)
    write_results(args.out, r, load_before)
    return 0


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, ReadmeRow, heading, load_note, fmt_spread as _sp)


REPORT_TITLE = "Weight transfer"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``weight_transfer.json``."""
    d = load("weight_transfer")
    if not d:
        return []
    rl, syn, lat = d["rl"], d["synthetic"], d["latency"]
    out = [*heading(REPORT_TITLE),
           "**Weight transfer** — `python -m astraflow.benchmarks.weight_transfer` (real GRPO steps of the "
           f"DeepSpeed CPU trainer, {rl['info']['params']:,} params; synthetic {syn['params'] / 1e9:g} B-parameter "
           f"bf16 model with 1 % of elements changed; median (min–max) of {d['repeats']} rounds{load_note(d)}. The "
           "entropy estimate is log2 C(n, k) for the change mask plus the order-0 entropy of each byte plane of the "
           "new values: an estimate, not a bound)", "",
           "| measurement | fp32 (as trained on CPU) | bf16 (as a GPU engine holds it) |", "|---|---:|---:|"]
    f, b = rl["fp32"], rl["bf16"]
    out.append(f"| changed elements per step | {_sp(f['changed_fraction'], '.1%')} | {_sp(b['changed_fraction'], '.1%')} |")
    out.append(f"| delta bytes / full snapshot bytes | {_sp(f['delta_over_snapshot'], '.3f')} | "
               f"{_sp(b['delta_over_snapshot'], '.3f')} |")
    out.append(f"| delta bytes / entropy estimate | {_sp(f['delta_over_entropy_estimate'], '.3f')} | "
               f"{_sp(b['delta_over_entropy_estimate'], '.3f')} |")
    big = f"{syn['params'] / 1e9:g} B"
    out += ["", f"| {big} bf16, 1 % changed, {syn['threads']} threads | GB/s of weights | vs memcpy |", "|---|---:|---:|",
            f"| memcpy (`numpy.copyto`, {syn['threads']} threads) | {_sp(syn['memcpy_gbps'])} | 1.00 |",
            f"| delta encode | {_sp(syn['delta_encode_gbps'])} | {_sp(syn['encode_vs_memcpy'], '.3f')} |",
            f"| delta decode + apply (verified) | {_sp(syn['delta_apply_gbps'])} | {_sp(syn['decode_vs_memcpy'], '.3f')} |",
            "", "| publish → all subscribers hold it | delta | full snapshot | snapshot end to end |", "|---|---:|---:|---:|"]
    for key, label in (("tiny", "tiny model"), ("big", f"{big} model"), ("big_fanout", f"{big} model")):
        x = lat.get(key)
        if x:
            out.append(f"| {label} ({x['subscribers']} subscriber{'s' if x['subscribers'] != 1 else ''}) | {_sp(x['delta_s'])} s ({x['delta_bytes'] / 1e6:.1f} MB) | "
                       f"{_sp(x['full_s'])} s ({x['full_bytes'] / 1e6:.1f} MB) | {_sp(x['snapshot_e2e_MBps'], '.1f')} MB/s |")
    k = d["kafka_tool_consume"]
    out += ["", f"`kafka-consumer-perf-test` reading the {big} model's {k['records']:,} chunk records from the same broker: "
            f"{_sp(k['MBps'], '.1f')} MB/s; the snapshot's end-to-end rate (one subscriber) is "
            f"{_sp(d['snapshot_e2e_vs_kafka_tool_paired'], '.3f')} of it (paired per round)."]
    kp = d.get("kafka_tool_produce")
    if kp:
        out[-1] += (f" `kafka-producer-perf-test` writing {kp['records']:,} records of 1 MiB with the publisher's settings: "
                    f"{_sp(kp['MBps'], '.1f')} MB/s. A version is announced only once durable, so the tools' produce "
                    f"time plus their consume time ({d['kafka_tools_in_series_MBps']:.1f} MB/s) is the ceiling for "
                    f"publish → applied: the snapshot reaches "
                    f"{_sp(d['snapshot_e2e_vs_kafka_tools_in_series_paired'], '.3f')} of it (paired per round).")
    return out + [""]


def readme_row(load: Loader) -> ReadmeRow | None:
    """The README's line: a bf16 delta's bytes against a full snapshot's, on real RL steps."""
    d = load("weight_transfer")
    if not d:
        return None
    return ReadmeRow(REPORT_TITLE, f"bytes of a bf16 delta / a full snapshot, real GRPO steps, median of {d['repeats']}",
                     f"{d['rl']['bf16']['delta_over_snapshot']['median']:.3f}", "lower")


if __name__ == "__main__":
    raise SystemExit(main())
