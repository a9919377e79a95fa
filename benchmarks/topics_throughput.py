"""Kafka path throughput: our typed wrappers and chunking vs Kafka's own perf tools.

One embedded broker (or ``--bootstrap-servers``), one run, three workloads:

(a) typed trajectory records (2 samples x 72 tokens, ~5 KiB) through :class:`Producer` /
    :class:`Consumer` (orjson encode + decode, idempotent, acks=all, zstd), next to
    ``kafka-producer-perf-test`` / ``kafka-consumer-perf-test`` sending the very same
    JSON payloads (``--payload-file``) with the same producer settings;
(b) seed-shaped trajectory records (8 samples x ``--large-tokens``) through the same
    wrappers, next to plain kafka-python only;
(c) 1 MiB weight chunks through ``write_chunks`` / ``ChunkReader`` (BLAKE3 per chunk
    and per object), next to the perf tools at the same record size, no compression.

A third client, plain kafka-python with the same settings and the same bytes (values
and headers encoded beforehand; no decoding, no checksums; kafka-python's own record
reading), shows what our wrappers cost on top of the client library they use, apart from
what kafka-python costs against Kafka's Java clients. Our consumers read fetched batches
with the C record reader (``topics/records.py``); for (a) and (b) plain kafka-python also
reads the same records with it, which shows what the reader alone gains. Importing
``astraflow.topics`` gives kafka-python larger socket reads (``topics/socket_reads.py``), so
plain kafka-python consumes with them too; a fourth consumer, plain kafka-python with its
stock 4 KiB reads, shows what they gain. For
(a) and (b) our consumer also reads the same groups as schema 2 wrote them (number arrays
as JSON arrays, not packed hex: :mod:`astraflow.topics.packed`), which shows what packing
gains. Every client runs ``--repeats`` times on fresh topics, in turn, so load from other
processes hits all alike: median (min–max).

Prints one table (MB/s, ours/Kafka tool, ours/kafka-python, larger/stock reads, packed/JSON
arrays, our record reader/kafka-python's) and writes JSON to
``benchmarks/results/topics_throughput.json``.
"""

from __future__ import annotations

import argparse
import contextlib
from collections import defaultdict
import os
import tempfile
import time
import uuid
from pathlib import Path

import orjson

from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.topics import (ChunkReader, Consumer, EmbeddedBroker, Producer, Sample, TopicPartition, TopicSpec,
                              TrajectoryGroup, ensure_topics, socket_reads, write_chunks)
from astraflow.topics.codec import encode
from astraflow.topics.runtime import kafka_version, run_tool
from astraflow.topics import security

MB = 1e6
RESULTS = Path(__file__).resolve().parent / "results" / "topics_throughput.json"


def trajectory(i: int, target_bytes: int = 4096, n_samples: int = 2, n_tokens: int = 72) -> TrajectoryGroup:
    """A trajectory group of ``n_samples`` x ``n_tokens`` token ids, logprobs and versions,
    its encoded value padded to ``target_bytes`` where it is shorter."""
    samples = [Sample(tokens=[(i * 7 + t) % 151 for t in range(n_tokens)],
                      logprobs=[-((i + t) % 97) / 37.0 for t in range(n_tokens)],
                      versions=[i // 100] * n_tokens, reward=float(i % 2), finish_reason="stop",
                      text=str(i))
               for _ in range(n_samples)]
    g = TrajectoryGroup(f"task-{i}", f"p-{i}", "policy", "raas-0", list(range(12)), samples,
                        scheduled_version=i // 100)
    size = len(encode(g)[0])
    pad = max(0, target_bytes - size)
    return TrajectoryGroup(g.task_id, g.prompt_id, g.policy, g.node_id, g.prompt_ids, g.samples,
                           g.scheduled_version, error="x" * pad)


def json_arrays(msgs: list[TrajectoryGroup]) -> list[tuple[bytes, list]]:
    """``msgs`` as schema 2 wrote them: every number array a JSON array (what this code still
    reads; the packed hex of schema 3 is what it writes)."""
    headers = [("af-type", TrajectoryGroup.TYPE.encode()), ("af-schema", b"2"), ("af-producer", b"bench")]
    return [(orjson.dumps(m, default=lambda a: a.tolist()), headers) for m in msgs]


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
    props = _consumer_props()
    try:
        proc = run_tool("kafka-consumer-perf-test", [
            "--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(n), "--timeout", "60000",
            "--hide-header", "--consumer.config", props], heap="1g", timeout=900)
    finally:
        Path(props).unlink(missing_ok=True)
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


def ours_typed(bootstrap: str, topic: str, msgs: list[TrajectoryGroup], n: int, value_bytes: float) -> tuple[dict, dict]:
    with Producer(bootstrap, client_id="bench", linger_ms=5) as p:
        t0 = time.perf_counter()
        for i in range(n):
            p.send(topic, msgs[i % len(msgs)], key=f"task-{i}", trace=False)
        p.flush()
        dt = time.perf_counter() - t0
    prod = {"records": n, "bytes": n * value_bytes, "seconds": dt}
    return prod, ours_consume(bootstrap, topic, n, value_bytes)


def ours_consume(bootstrap: str, topic: str, n: int, value_bytes: float) -> dict:
    """Our :class:`Consumer` (a group member, decoding every record to its message) reading ``n`` records."""
    with Consumer(bootstrap, topics=[topic], group_id=f"bench-{uuid.uuid4().hex[:6]}",
                  max_poll_records=2000) as c:
        got, t0, cpu0 = 0, None, 0.0
        while got < n:
            # the first poll (which joins the group) takes one record: the timing starts after it, so it must not
            # take a large part of what is timed (a poll hands out whatever the fetches brought, tens of MB)
            batch = c.poll(5000, max_records=1 if t0 is None else None)
            if not batch:
                raise RuntimeError(f"consumer stalled at {got}/{n}")
            if t0 is None:
                t0, cpu0 = time.perf_counter(), time.thread_time()
            got += len(batch)
        del batch  # the last batch's release counts too, as each earlier one's did
        dt, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    return {"records": got, "bytes": got * value_bytes, "seconds": dt, "cpu_seconds": cpu}


def plain_produce(bootstrap: str, topic: str, records: list[tuple[bytes, list]], n: int, **settings) -> dict:
    """kafka-python's ``KafkaProducer`` sending ready-made (value, headers) pairs."""
    kp = security.producer(bootstrap_servers=bootstrap, client_id="bench-plain", acks="all", enable_idempotence=True,
                           batch_size=256 * 1024, **settings)
    try:
        t0 = time.perf_counter()
        futures = [kp.send(topic, value=records[i % len(records)][0], key=f"task-{i}".encode(),
                           headers=records[i % len(records)][1], partition=0) for i in range(n)]
        kp.flush()
        dt = time.perf_counter() - t0
        for f in futures:
            f.get(0)  # every record acknowledged, as ours checks
    finally:
        kp.close()
    return {"records": n, "bytes": sum(len(records[i % len(records)][0]) for i in range(n)), "seconds": dt}


def plain_consume(bootstrap: str, topic: str, n: int, record_reader: bool = False) -> dict:
    """kafka-python's ``KafkaConsumer`` reading ``n`` records' bytes (no decoding), the records
    read by kafka-python itself or (``record_reader``) by our C reader (:mod:`astraflow.topics.records`)."""
    kc = security.consumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                           record_reader=record_reader,
                           isolation_level="read_committed", max_partition_fetch_bytes=8 * 1024 * 1024,
                           fetch_max_bytes=64 * 1024 * 1024, client_id="bench-plain")
    try:
        kc.assign([TopicPartition(topic, 0)])
        kc.seek_to_beginning()
        got = nbytes = 0
        t0, cpu0 = None, 0.0
        while got < n:
            batches = kc.poll(5000, max_records=1 if t0 is None else 2000)  # the first: one record, as ours
            if not batches:
                raise RuntimeError(f"kafka-python consumer stalled at {got}/{n}")
            if t0 is None:
                t0, cpu0 = time.perf_counter(), time.thread_time()
            for records in batches.values():
                got += len(records)
                nbytes += sum(len(r.value) for r in records)
        del batches
        dt, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    finally:
        kc.close()
    return {"records": got, "bytes": nbytes, "seconds": dt, "cpu_seconds": cpu}


def stock_consume(bootstrap: str, topic: str, n: int) -> dict:
    """:func:`plain_consume` with kafka-python's own 4 KiB socket reads."""
    socket_reads.uninstall()
    try:
        return plain_consume(bootstrap, topic, n)
    finally:
        socket_reads.install()


def ours_chunks(bootstrap: str, topic: str, payload: bytes, chunk: int) -> tuple[dict, dict]:
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
    return ({"records": n, "bytes": len(payload), "seconds": dt_w},
            {"records": n, "bytes": len(payload), "seconds": dt_r})


TYPED = "typed trajectories, 2 x 72 tokens"
LARGE = "typed trajectories, 8 x {tokens} tokens"
CHUNKS = "1 MiB weight chunks"
READER = "kafka-python, our record reader"


def one_round(bootstrap: str, names: dict[str, str], args, msgs, value_bytes: float, payload_file: Path,
              payload: bytes, chunk: int, large: list[TrajectoryGroup],
              encoded: dict[str, list[tuple[bytes, list]]]) -> list[tuple[str, str, str, dict]]:
    """Every client on every workload once: ``(workload, op, client, measurement)``. ``encoded``:
    the records made once for all rounds (:func:`prepared`)."""
    out = []
    typed, chunks = TYPED, CHUNKS
    op, oc = ours_typed(bootstrap, names["ours4k"], msgs, args.records, value_bytes)
    pp = plain_produce(bootstrap, names["plain4k"], encoded["typed"], args.records, compression_type="zstd", linger_ms=5)
    pc = plain_consume(bootstrap, names["plain4k"], args.records)
    sc = stock_consume(bootstrap, names["plain4k"], args.records)
    rc = plain_consume(bootstrap, names["plain4k"], args.records, record_reader=True)
    kp = perf_producer(bootstrap, names["kafka4k"], args.records, None, str(payload_file),
                       {"acks": "all", "enable.idempotence": "true", "compression.type": "zstd",
                        "linger.ms": "5", "batch.size": str(256 * 1024)})
    kp.update(bytes=kp["records"] * value_bytes, seconds=kp["records"] / kp["records_per_s"])
    kc = perf_consumer(bootstrap, names["kafka4k"], args.records)
    out += [(typed, "produce", "ours", op), (typed, "consume", "ours", oc),
            (typed, "produce", "kafka-python", pp), (typed, "consume", "kafka-python", pc),
            (typed, "consume", "kafka-python stock reads", sc), (typed, "consume", READER, rc),
            (typed, "produce", "kafka tool", kp), (typed, "consume", "kafka tool", kc)]
    out.append((typed, "consume", "ours, JSON arrays", _json_arrays_consume(bootstrap, names["json4k"],
                                                                         encoded["typed_json"], args.records)))
    if large:  # seed-shaped groups: the same clients but the perf tools
        workload = LARGE.format(tokens=len(large[0].samples[0].tokens))
        n = args.large_records
        lp, lc = ours_typed(bootstrap, names["ourslarge"], large, n, mean_bytes(encoded["large"]))
        lpp = plain_produce(bootstrap, names["plainlarge"], encoded["large"], n, compression_type="zstd", linger_ms=5)
        lpc = plain_consume(bootstrap, names["plainlarge"], n)
        lrc = plain_consume(bootstrap, names["plainlarge"], n, record_reader=True)
        out += [(workload, "produce", "ours", lp), (workload, "consume", "ours", lc),
                (workload, "produce", "kafka-python", lpp), (workload, "consume", "kafka-python", lpc),
                (workload, "consume", READER, lrc),
                (workload, "consume", "ours, JSON arrays", _json_arrays_consume(bootstrap, names["jsonlarge"],
                                                                                encoded["large_json"], n))]

    cw, cr = ours_chunks(bootstrap, names["ourschunks"], payload, chunk)
    n_chunks = cw["records"]
    pieces = [(bytes(payload[i:i + chunk]), []) for i in range(0, len(payload), chunk)]
    pw = plain_produce(bootstrap, names["plainchunks"], pieces, n_chunks, compression_type=None, linger_ms=0,
                       max_request_size=4 * 1024 * 1024)
    pr = plain_consume(bootstrap, names["plainchunks"], n_chunks)
    sr = stock_consume(bootstrap, names["plainchunks"], n_chunks)
    kp2 = perf_producer(bootstrap, names["kafkachunks"], n_chunks, chunk, None,
                        {"acks": "all", "enable.idempotence": "true", "compression.type": "none",
                         "max.request.size": str(4 * 1024 * 1024), "linger.ms": "0"})
    kp2.update(bytes=kp2["records"] * chunk, seconds=kp2["records"] / kp2["records_per_s"])
    kc2 = perf_consumer(bootstrap, names["kafkachunks"], n_chunks)
    out += [(chunks, "produce", "ours", cw), (chunks, "consume", "ours", cr),
            (chunks, "produce", "kafka-python", pw), (chunks, "consume", "kafka-python", pr),
            (chunks, "consume", "kafka-python stock reads", sr),
            (chunks, "produce", "kafka tool", kp2), (chunks, "consume", "kafka tool", kc2)]
    return out


def _json_arrays_consume(bootstrap: str, topic: str, records: list[tuple[bytes, list]], n: int) -> dict:
    """Our consumer reading the same groups written as schema 2 did (JSON arrays: :func:`json_arrays`)."""
    plain_produce(bootstrap, topic, records, n, compression_type="zstd", linger_ms=5)
    return ours_consume(bootstrap, topic, n, mean_bytes(records))


def mean_bytes(records: list[tuple[bytes, list]]) -> float:
    """The mean value size of (value, headers) records."""
    return sum(len(v) for v, _ in records) / len(records)


def prepared(msgs: list[TrajectoryGroup], large: list[TrajectoryGroup]) -> dict[str, list[tuple[bytes, list]]]:
    """The records plain kafka-python sends, made once for every round: as this code writes them
    and as schema 2 did."""
    return {"typed": [encode(m, "bench") for m in msgs], "typed_json": json_arrays(msgs),
            "large": [encode(m, "bench") for m in large], "large_json": json_arrays(large)}


CLIENTS = {"ours": "ours", "kafka-python": "plain", "kafka tool": "kafka", "kafka-python stock reads": "stock",
           "ours, JSON arrays": "json", READER: "reader"}


def summarise(rounds: list[list[tuple[str, str, str, dict]]]) -> list[dict]:
    """One row per (workload, op): each client's MB/s and records/s as spreads, and the
    ratios paired round by round."""
    runs: dict[tuple[str, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for rnd in rounds:
        for workload, op, client, m in rnd:
            runs[(workload, op)][client].append(m)
    table = []
    for (workload, op), by_client in runs.items():
        row: dict = {"workload": workload, "op": op}
        for client, prefix in CLIENTS.items():
            ms = by_client.get(client)
            if not ms:  # stock reads: consumers only
                continue
            row[f"{prefix}_MB_per_s"] = spread([m["bytes"] / m["seconds"] / MB for m in ms])
            row[f"{prefix}_records_per_s"] = spread([m["records"] / m["seconds"] for m in ms])
            if all("cpu_seconds" in m for m in ms):  # the consuming thread's CPU: what load does not stretch
                row[f"{prefix}_cpu_us_per_record"] = spread([m["cpu_seconds"] / m["records"] * 1e6 for m in ms])
        if "kafka_records_per_s" in row:  # the perf tools run the first two workloads
            row["ours_over_kafka"] = ratio_spread(row["ours_records_per_s"], row["kafka_records_per_s"])
            row["plain_over_kafka"] = ratio_spread(row["plain_records_per_s"], row["kafka_records_per_s"])
        row["ours_over_plain"] = ratio_spread(row["ours_records_per_s"], row["plain_records_per_s"])
        if "json_records_per_s" in row:  # the same groups, packed (schema 3) over JSON arrays (schema 2)
            row["packed_over_json"] = ratio_spread(row["ours_records_per_s"], row["json_records_per_s"])
        if "ours_cpu_us_per_record" in row and "plain_cpu_us_per_record" in row:
            # as a rate: records per CPU second, ours over kafka-python's
            row["ours_over_plain_cpu"] = ratio_spread(row["plain_cpu_us_per_record"], row["ours_cpu_us_per_record"])
        if "reader_records_per_s" in row:  # the same records, read by our C reader instead of kafka-python's
            row["reader_over_plain"] = ratio_spread(row["reader_records_per_s"], row["plain_records_per_s"])
        if "stock_records_per_s" in row:  # the same records read the same way but for the socket reads
            row["plain_over_stock"] = ratio_spread(row["plain_records_per_s"], row["stock_records_per_s"])
        table.append(row)
    return table


def print_cpu(table: list[dict]) -> None:
    """The consumers' CPU per record (the consuming thread's), where both sides measured it."""
    for r in table:
        if "ours_over_plain_cpu" in r:
            reader = (f", kafka-python with our record reader {fmt_spread(r['reader_cpu_us_per_record'], '.1f')}"
                      if "reader_cpu_us_per_record" in r else "")
            print(f"{r['workload']} {r['op']}: CPU µs/record ours {fmt_spread(r['ours_cpu_us_per_record'], '.1f')}, "
                  f"kafka-python {fmt_spread(r['plain_cpu_us_per_record'], '.1f')}{reader}; "
                  f"ours/kafka-python per CPU second {fmt_spread(r['ours_over_plain_cpu'])}")


def print_table(table: list[dict]) -> None:
    hdr = (f"{'workload':38} {'op':8} {'ours MB/s':>20} {'kafka-python MB/s':>20} {'Kafka tool MB/s':>20} "
           f"{'ours/tool':>18} {'ours/kafka-python':>18} {'4 KiB reads MB/s':>20} {'larger/4 KiB reads':>18} "
           f"{'packed/JSON arrays':>18} {'C reader/kafka-py':>18}")
    print(hdr)
    print("-" * len(hdr))
    for r in table:
        def cell(key: str, fmt: str = ".2f") -> str:
            return fmt_spread(r[key], fmt) if key in r else "-"
        print(f"{r['workload']:38} {r['op']:8} {cell('ours_MB_per_s', '.1f'):>20} "
              f"{cell('plain_MB_per_s', '.1f'):>20} {cell('kafka_MB_per_s', '.1f'):>20} "
              f"{cell('ours_over_kafka'):>18} {cell('ours_over_plain'):>18} "
              f"{cell('stock_MB_per_s', '.1f'):>20} {cell('plain_over_stock'):>18} {cell('packed_over_json'):>18} "
              f"{cell('reader_over_plain'):>18}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap-servers")
    ap.add_argument("--records", type=int, default=30_000, help="trajectory records of 2 x 72 tokens")
    ap.add_argument("--large-records", type=int, default=1_000, help="trajectory records of 8 x --large-tokens")
    ap.add_argument("--large-tokens", type=int, default=512, help="tokens per sample of the large records; 0: none")
    ap.add_argument("--chunk-mb", type=int, default=256, help="MiB of weight chunks")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="3,000 records, 32 MiB of chunks (a smoke run)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.quick:
        args.records, args.chunk_mb = min(args.records, 3000), min(args.chunk_mb, 32)
        args.large_records = min(args.large_records, 200)
    if args.repeats < 3:
        ap.error("--repeats must be >= 3 (the tables show median and spread)")
    load_before = load_now()
    chunk = 1024 * 1024
    msgs = [trajectory(i) for i in range(min(args.records, 2000))]
    large = ([trajectory(i, 0, n_samples=8, n_tokens=args.large_tokens) for i in range(min(args.large_records, 200))]
             if args.large_tokens else [])
    encoded = prepared(msgs, large)
    value_bytes = mean_bytes(encoded["typed"])  # the values alone: the producer header adds nothing to them
    payload = os.urandom(args.chunk_mb * 1024 * 1024)
    payload_file = Path(tempfile.gettempdir()) / f"af-bench-payloads-{os.getpid()}.txt"
    payload_file.write_bytes(b"\n".join(encode(trajectory(i))[0] for i in range(200)))
    rounds, raw = [], []
    try:
        with contextlib.ExitStack() as stack:
            bootstrap = args.bootstrap_servers
            if not bootstrap:
                bootstrap = stack.enter_context(EmbeddedBroker(heap="2g")).bootstrap_servers
            for _ in range(args.repeats):
                job = f"bench{uuid.uuid4().hex[:6]}"
                names = {k: f"af.{job}.{k}" for k in ("ours4k", "plain4k", "kafka4k", "json4k", "ourslarge",
                                                      "plainlarge", "jsonlarge", "ourschunks", "plainchunks",
                                                      "kafkachunks")}
                ensure_topics(bootstrap, [TopicSpec(n, partitions=1, max_message_bytes=4 * 1024 * 1024)
                                          for n in names.values()])
                rounds.append(one_round(bootstrap, names, args, msgs, value_bytes, payload_file, payload, chunk,
                                        large, encoded))
                raw += [m.get("raw") for *_, m in rounds[-1] if m.get("raw")]
    finally:
        payload_file.unlink(missing_ok=True)
    table = summarise(rounds)
    print_table(table)
    print_cpu(table)
    out = {"benchmark": "topics_throughput", "kafka_version": kafka_version(), "records": args.records,
           "trajectory_value_bytes": int(value_bytes), "large_records": args.large_records if large else 0,
           "large_tokens": args.large_tokens,
           "large_value_bytes": int(mean_bytes(encoded["large"])) if large else 0,
           "json_arrays_value_bytes": int(mean_bytes(encoded["typed_json"])), "chunk_bytes": chunk,
           "chunk_total_mib": args.chunk_mb,
           "repeats": args.repeats, "rows": table, "kafka_tool_output": raw}
    write_results(args.out, out, load_before)
    return 0


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, heading, load_note, fmt_spread as _sp)


REPORT_TITLE = "Kafka path"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from ``topics_throughput.json``."""
    d = load("topics_throughput")
    if not d:
        return []
    large = (f", {d['large_records']:,} of 8 x {d.get('large_tokens', 512)} tokens (~{d['large_value_bytes']:,} B)"
             if d.get("large_records") else "")
    out = [*heading(REPORT_TITLE),
           f"**Kafka path** — `python -m astraflow.benchmarks.topics_throughput` (Kafka {d['kafka_version']}, "
           f"{d['records']:,} trajectory records of ~{d['trajectory_value_bytes']:,} B{large}, "
           f"{d['chunk_total_mib']} MiB of 1 MiB chunks; ours = typed wrappers with orjson, idempotence, "
           "acks=all, zstd / chunking with BLAKE3; kafka-python = the same client with the same settings and bytes, "
           "no decoding or checksums; Kafka tool = its own perf tools, same payloads and settings; 4 KiB reads = "
           "plain kafka-python consuming with its stock socket reads instead of `topics/socket_reads.py`'s; "
           "packed / JSON arrays = our consumer on the same groups with packed number arrays (schema 3) over "
           "JSON arrays (schema 2), records/s; C reader / kafka-python = plain kafka-python reading the same records "
           "with our C record reader (`topics/records.py`, which our consumers use) over kafka-python's own reading, "
           f"records/s; MB/s median (min–max) of {d['repeats']} rounds{load_note(d)})", "",
           "| workload | op | ours MB/s | kafka-python MB/s | Kafka tool MB/s | ours / Kafka tool | ours / kafka-python | "
           "kafka-python, 4 KiB reads MB/s | larger / 4 KiB reads | packed / JSON arrays | C reader / kafka-python |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        def cell(key: str, fmt: str = ".2f") -> str:
            return _sp(r[key], fmt) if key in r else "–"
        out.append(f"| {r['workload']} | {r['op']} | {cell('ours_MB_per_s', '.1f')} | {cell('plain_MB_per_s', '.1f')} | "
                   f"{cell('kafka_MB_per_s', '.1f')} | {cell('ours_over_kafka')} | {cell('ours_over_plain')} | "
                   f"{cell('stock_MB_per_s', '.1f')} | {cell('plain_over_stock')} | {cell('packed_over_json')} | "
                   f"{cell('reader_over_plain')} |")
    return out + [""]


if __name__ == "__main__":
    raise SystemExit(main())
