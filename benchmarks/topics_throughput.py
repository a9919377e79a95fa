"""Kafka path throughput: our typed wrappers and chunking vs Kafka's own perf tools.

One embedded broker (or ``--bootstrap-servers``), one run, two workloads:

(a) ~4 KiB typed trajectory records through :class:`Producer` / :class:`Consumer`
    (orjson encode + decode, idempotent, acks=all, zstd), next to
    ``kafka-producer-perf-test`` / ``kafka-consumer-perf-test`` sending the very same
    JSON payloads (``--payload-file``) with the same producer settings;
(b) 1 MiB weight chunks through ``write_chunks`` / ``ChunkReader`` (sha256 per chunk
    and per object), next to the perf tools at the same record size, no compression.

Prints one table (records/s, MB/s, ours/Kafka ratio) and writes JSON to
``benchmarks/results/topics_throughput.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import uuid
from pathlib import Path

from astraflow.benchmarks.results_io import write_results
from astraflow.topics import (ChunkReader, Consumer, EmbeddedBroker, Producer, Sample, TopicSpec,
                              TrajectoryGroup, ensure_topics, write_chunks)
from astraflow.topics.codec import encode
from astraflow.topics.runtime import kafka_version, run_tool

MB = 1e6
RESULTS = Path(__file__).resolve().parent / "results" / "topics_throughput.json"


def trajectory(i: int, target_bytes: int = 4096) -> TrajectoryGroup:
    """A trajectory group whose JSON value is close to ``target_bytes``."""
    n_tokens = 72  # 2 samples x 72 tokens of ids, logprobs and versions, padded to ~4 KiB of JSON
    samples = [Sample(tokens=[(i * 7 + t) % 151 for t in range(n_tokens)],
                      logprobs=[-((i + t) % 97) / 37.0 for t in range(n_tokens)],
                      versions=[i // 100] * n_tokens, reward=float(i % 2), finish_reason="stop",
                      text=str(i))
               for _ in range(2)]
    g = TrajectoryGroup(f"task-{i}", f"p-{i}", "policy", "raas-0", list(range(12)), samples,
                        scheduled_version=i // 100)
    size = len(encode(g)[0])
    pad = max(0, target_bytes - size)
    return TrajectoryGroup(g.task_id, g.prompt_id, g.policy, g.node_id, g.prompt_ids, g.samples,
                           g.scheduled_version, error="x" * pad)


def perf_producer(bootstrap: str, topic: str, n: int, size: int | None, payload_file: str | None,
                  props: dict[str, str]) -> dict:
    args = ["--topic", topic, "--num-records", str(n), "--throughput", "-1",
            "--producer-props", f"bootstrap.servers={bootstrap}", *[f"{k}={v}" for k, v in props.items()]]
    args += ["--payload-file", payload_file] if payload_file else ["--record-size", str(size)]
    proc = run_tool("kafka-producer-perf-test", args, heap="1g", timeout=900)
    last = [line for line in proc.stdout.splitlines() if "records sent" in line][-1]
    # "N records sent, X records/sec (Y MB/sec), ..." (Kafka's MB is 1024*1024)
    parts = last.replace("(", "").split()
    rps = float(parts[3])
    return {"records": int(parts[0]), "records_per_s": rps, "raw": last}


def perf_consumer(bootstrap: str, topic: str, n: int) -> dict:
    proc = run_tool("kafka-consumer-perf-test", [
        "--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(n), "--timeout", "60000",
        "--show-detailed-stats" if False else "--hide-header",
        "--consumer.config", _consumer_props()], heap="1g", timeout=900)
    line = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1]
    f = [x.strip() for x in line.split(",")]
    # start, end, MB, MB/s, nMsg, nMsg/s, rebalance ms, fetch ms, fetch MB/s, fetch nMsg/s
    mb, n_msg, fetch_ms = float(f[2]), int(f[4]), float(f[7])
    return {"records": n_msg, "records_per_s": n_msg / (fetch_ms / 1000), "bytes": mb * 1024 * 1024,
            "seconds": fetch_ms / 1000, "raw": line}


def _consumer_props() -> str:
    path = Path(tempfile.gettempdir()) / f"af-perf-consumer-{os.getpid()}.properties"
    path.write_text("max.partition.fetch.bytes=8388608\nfetch.max.bytes=67108864\n"
                    "isolation.level=read_committed\n")
    return str(path)


def ours_typed(bootstrap: str, topic: str, n: int) -> tuple[dict, dict, int]:
    msgs = [trajectory(i) for i in range(min(n, 2000))]
    value_bytes = sum(len(encode(m)[0]) for m in msgs) / len(msgs)
    with Producer(bootstrap, client_id="bench", linger_ms=5) as p:
        t0 = time.perf_counter()
        for i in range(n):
            p.send(topic, msgs[i % len(msgs)], key=f"task-{i}", trace=False)
        p.flush()
        dt = time.perf_counter() - t0
    prod = {"records": n, "records_per_s": n / dt, "bytes": n * value_bytes, "seconds": dt}
    with Consumer(bootstrap, topics=[topic], group_id=f"bench-{uuid.uuid4().hex[:6]}",
                  max_poll_records=2000) as c:
        got, t0 = 0, None
        while got < n:
            batch = c.poll(5000)
            if not batch:
                raise RuntimeError(f"consumer stalled at {got}/{n}")
            t0 = t0 or time.perf_counter()
            got += len(batch)
        dt = time.perf_counter() - t0
    cons = {"records": got, "records_per_s": got / dt, "bytes": got * value_bytes, "seconds": dt}
    return prod, cons, int(value_bytes)


def ours_chunks(bootstrap: str, topic: str, total_mb: int, chunk: int) -> tuple[dict, dict]:
    payload = os.urandom(total_mb * 1024 * 1024)
    with Producer(bootstrap, client_id="bench-chunks", compression_type=None, linger_ms=0,
                  max_request_size=4 * 1024 * 1024) as p:
        t0 = time.perf_counter()
        manifest = write_chunks(p, topic, payload, chunk_size=chunk)
        dt_w = time.perf_counter() - t0
    with ChunkReader(bootstrap) as r:
        t0 = time.perf_counter()
        back = r.read(manifest)
        dt_r = time.perf_counter() - t0
    assert back == payload
    n = len(manifest.chunks)
    return ({"records": n, "records_per_s": n / dt_w, "bytes": len(payload), "seconds": dt_w},
            {"records": n, "records_per_s": n / dt_r, "bytes": len(payload), "seconds": dt_r})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap-servers")
    ap.add_argument("--records", type=int, default=30_000, help="4 KiB trajectory records")
    ap.add_argument("--chunk-mb", type=int, default=512, help="MiB of weight chunks")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    chunk = 1024 * 1024
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers
        if not bootstrap:
            bootstrap = stack.enter_context(EmbeddedBroker(heap="2g")).bootstrap_servers
        job = f"bench{uuid.uuid4().hex[:6]}"
        names = {k: f"af.{job}.{k}" for k in ("ours4k", "kafka4k", "ourschunks", "kafkachunks")}
        ensure_topics(bootstrap, [TopicSpec(n, partitions=1, max_message_bytes=4 * 1024 * 1024)
                                  for n in names.values()])
        rows = []

        op, oc, value_bytes = ours_typed(bootstrap, names["ours4k"], args.records)
        payload_file = Path(tempfile.gettempdir()) / f"af-bench-payloads-{os.getpid()}.txt"
        payload_file.write_bytes(b"\n".join(encode(trajectory(i))[0] for i in range(200)))
        kp = perf_producer(bootstrap, names["kafka4k"], args.records, None, str(payload_file),
                           {"acks": "all", "enable.idempotence": "true", "compression.type": "zstd",
                            "linger.ms": "5", "batch.size": str(256 * 1024)})
        kp["bytes"] = kp["records"] * value_bytes
        kc = perf_consumer(bootstrap, names["kafka4k"], args.records)
        rows += [("typed ~4 KiB trajectories", "produce", op, kp),
                 ("typed ~4 KiB trajectories", "consume", oc, kc)]

        cw, cr = ours_chunks(bootstrap, names["ourschunks"], args.chunk_mb, chunk)
        n_chunks = cw["records"]
        kp2 = perf_producer(bootstrap, names["kafkachunks"], n_chunks, chunk, None,
                            {"acks": "all", "enable.idempotence": "true", "compression.type": "none",
                             "max.request.size": str(4 * 1024 * 1024), "linger.ms": "0"})
        kp2["bytes"] = kp2["records"] * chunk
        kc2 = perf_consumer(bootstrap, names["kafkachunks"], n_chunks)
        rows += [("1 MiB weight chunks", "produce", cw, kp2), ("1 MiB weight chunks", "consume", cr, kc2)]

    table = []
    for workload, op_name, ours, kafka in rows:
        ours_mbs = ours["bytes"] / ours["seconds"] / MB if "seconds" in ours else None
        kafka_mbs = (kafka["bytes"] / kafka["seconds"] / MB if "seconds" in kafka
                     else kafka["records_per_s"] * (kafka["bytes"] / kafka["records"]) / MB)
        table.append({"workload": workload, "op": op_name,
                      "ours_records_per_s": round(ours["records_per_s"], 1), "ours_MB_per_s": round(ours_mbs, 1),
                      "kafka_records_per_s": round(kafka["records_per_s"], 1),
                      "kafka_MB_per_s": round(kafka_mbs, 1),
                      "ratio": round(ours["records_per_s"] / kafka["records_per_s"], 3)})
    hdr = f"{'workload':28} {'op':8} {'ours rec/s':>11} {'ours MB/s':>10} {'kafka rec/s':>12} {'kafka MB/s':>11} {'ours/kafka':>10}"
    print(hdr)
    print("-" * len(hdr))
    for r in table:
        print(f"{r['workload']:28} {r['op']:8} {r['ours_records_per_s']:>11,.0f} {r['ours_MB_per_s']:>10.1f} "
              f"{r['kafka_records_per_s']:>12,.0f} {r['kafka_MB_per_s']:>11.1f} {r['ratio']:>10.2f}")
    out = {"benchmark": "topics_throughput", "kafka_version": kafka_version(), "records": args.records,
           "trajectory_value_bytes": value_bytes, "chunk_bytes": chunk, "chunk_total_mib": args.chunk_mb,
           "rows": table, "kafka_tool_output": [r[3].get("raw") for r in rows]}
    write_results(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
