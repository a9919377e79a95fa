"""Client CPU per Kafka request: kafka-python (the project's client) against librdkafka, one broker.

A trained step of the demo makes ~63 Kafka requests across its processes (docs/benchmarks.md,
"Stop 75"), each paced — one record or one transaction at a time, with the step's other work
between them — so what a request costs the *client* process is part of every step's CPU on
two cores. This benchmark measures that cost for the project's client, kafka-python (pure
Python: its network thread encodes, frames and parses every request and holds the GIL while it
does; made as the project makes it, ``topics.security``'s constructors, the C record reader
included), and for librdkafka through ``confluent-kafka`` (C, its own threads), with the same
settings, bytes, counts and pacing, on one embedded broker:

* ``produce``: one 500-byte record, ``acks=all``, idempotent, flushed (a trajectory group, a
  metric): 300 at 50 a second;
* ``chunk``: one 1 MiB record, the same (a weight chunk): 40 at 20 a second;
* ``transaction``: begin, one 500-byte record, commit (a RaaS node's poll of tasks, the
  dataflow's batch): 100 at 10 a second;
* ``consume``: a ``read_committed`` group consumer receiving 500-byte records written at 50 a
  second: 300 records. The records are written by a librdkafka producer in the same process
  for both clients; its own CPU, measured alone in the same repetition, is subtracted.

A request's cost is the process's CPU (``time.process_time``: every thread, librdkafka's
included) over the paced loop, divided by the requests. The clients alternate, their order
rotating per repetition; each number is a median (min–max) of ``--repeats`` repetitions, and
``kafka_python_over_librdkafka`` pairs the two clients within a repetition. Prints one table;
writes ``benchmarks/results/kafka_clients.json``. Needs the ``bench`` extra
(``pip install -e '.[bench]'``: confluent-kafka); the project itself does not use librdkafka.

    python -m astraflow.benchmarks.kafka_clients            # 3 repetitions
    python -m astraflow.benchmarks.kafka_clients --quick    # 1 repetition, a tenth of the requests (smoke)
"""

from __future__ import annotations

import argparse
import os
from importlib import metadata
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.benchmarks.lib.table import print_header

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "kafka_clients.json"
CLIENTS = ("kafka-python", "librdkafka")
SMALL, CHUNK = 500, 1 << 20


class Pattern(NamedTuple):
    name: str
    size: int  #: bytes per record
    count: int  #: requests (records for ``consume``)
    per_s: float  #: pace
    what: str  #: a line for the table


PATTERNS = (
    Pattern("produce", SMALL, 300, 50, "one 500 B record, acks=all, idempotent, flushed"),
    Pattern("chunk", CHUNK, 40, 20, "one 1 MiB record, the same"),
    Pattern("transaction", SMALL, 100, 10, "begin, one 500 B record, commit"),
    Pattern("consume", SMALL, 300, 50, "one 500 B record received (read_committed group consumer)"),
)


def _paced(fn: Callable[[], None], count: int, per_s: float) -> None:
    due = time.monotonic()
    for _ in range(count):
        fn()
        due += 1.0 / per_s
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)


def _cpu_of(fn: Callable[[], None], count: int, per_s: float) -> float:
    """CPU seconds of this process over ``count`` paced calls of ``fn``."""
    c0 = time.process_time()
    _paced(fn, count, per_s)
    return time.process_time() - c0


def _producer(client: str, bootstrap: str, transactional: bool):
    """(send one record and wait for it, close) for ``client``, its transactions initialised."""
    tid = f"bench-{uuid.uuid4().hex[:8]}" if transactional else None
    if client == "kafka-python":
        from astraflow.topics import security
        p = security.producer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=0,
                              max_request_size=8 * CHUNK, **({"transactional_id": tid} if tid else {}))
        put, close = p.send, p.close
    else:
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 0,
                      "message.max.bytes": 8 * CHUNK, **({"transactional.id": tid} if tid else {})})
        put, close = p.produce, p.flush
    if tid:
        p.init_transactions()

    def send(topic: str, value: bytes) -> None:  # the two clients' calls have the same names here
        if tid:
            p.begin_transaction()
        put(topic, value)
        p.commit_transaction() if tid else p.flush()
    return send, close


def produce_cost(client: str, bootstrap: str, topic: str, pat: Pattern) -> float:
    """Client CPU seconds per paced request of ``pat`` (produce, chunk or transaction)."""
    send, close = _producer(client, bootstrap, pat.name == "transaction")
    value = os.urandom(pat.size)
    send(topic, value)  # connections, metadata, the producer id: not per-request costs
    time.sleep(1.0)
    try:
        return _cpu_of(lambda: send(topic, value), pat.count, pat.per_s) / pat.count
    finally:
        close()


def _writer(bootstrap: str):
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    return lambda topic, value: (p.produce(topic, value), p.flush())


def writer_cost(bootstrap: str, topic: str, pat: Pattern) -> float:
    """CPU seconds per record of the librdkafka writer ``consume`` uses, alone."""
    write, value = _writer(bootstrap), os.urandom(pat.size)
    write(topic, value)
    return _cpu_of(lambda: write(topic, value), pat.count, pat.per_s) / pat.count


def consume_cost(client: str, bootstrap: str, topic: str, pat: Pattern, writer_s: float) -> float:
    """Client CPU seconds per record a ``client`` group consumer receives (the writer's subtracted)."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    got, done = [0], threading.Event()
    if client == "kafka-python":
        from astraflow.topics import security
        c = security.consumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="latest",
                              enable_auto_commit=False, isolation_level="read_committed")

        def poll() -> None:
            got[0] += sum(len(v) for v in c.poll(500).values())
    else:
        from confluent_kafka import Consumer
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "latest",
                      "enable.auto.commit": False, "isolation.level": "read_committed"})
        c.subscribe([topic])

        def poll() -> None:
            m = c.poll(0.5)
            got[0] += m is not None and not m.error()
    write, value = _writer(bootstrap), os.urandom(pat.size)
    deadline = time.monotonic() + 60
    while got[0] == 0:  # joined, assigned and reading: one record through before the measurement
        write(topic, value)
        poll()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{client}: the consumer received nothing within 60 s")
    got[0] = 0

    def loop() -> None:
        while got[0] < pat.count and not done.is_set():
            poll()
    reader = threading.Thread(target=loop, daemon=True)
    c0 = time.process_time()
    reader.start()
    _paced(lambda: write(topic, value), pat.count, pat.per_s)
    reader.join(timeout=30)
    done.set()
    total = time.process_time() - c0
    c.close()
    if got[0] < pat.count:
        raise RuntimeError(f"{client}: the consumer received {got[0]} of {pat.count} records")
    return max(total / pat.count - writer_s, 0.0)


def one_repetition(bootstrap: str, rep: int, patterns: tuple[Pattern, ...], new_topic: Callable[[], str]) -> dict:
    """``{pattern: {client: CPU s per request}}``; the clients' order rotates with ``rep``."""
    order = CLIENTS[rep % 2:] + CLIENTS[:rep % 2]
    out: dict[str, dict[str, float]] = {}
    for pat in patterns:
        writer_s = writer_cost(bootstrap, new_topic(), pat) if pat.name == "consume" else 0.0
        for client in order:
            cost = (consume_cost(client, bootstrap, new_topic(), pat, writer_s) if pat.name == "consume"
                    else produce_cost(client, bootstrap, new_topic(), pat))
            out.setdefault(pat.name, {})[client] = cost
            print(f"  rep {rep} {pat.name:<12} {client:<13} {cost * 1e3:.3f} ms CPU per request", flush=True)
    return out


def aggregate(reps: list[dict]) -> dict:
    """Per pattern: each client's ms per request and kafka-python over librdkafka, paired by repetition."""
    out = {}
    for name in reps[0]:
        per = {c: spread([r[name][c] * 1e3 for r in reps]) for c in CLIENTS}
        out[name] = {"kafka_python_ms": per["kafka-python"], "librdkafka_ms": per["librdkafka"],
                     "kafka_python_over_librdkafka": ratio_spread(per["kafka-python"], per["librdkafka"])}
    return out


def print_table(r: dict) -> None:
    what = {p.name: p.what for p in PATTERNS}
    hdr = f"{'request':<12} {'kafka-python ms CPU':>24} {'librdkafka ms CPU':>24} {'ratio':>22}  what"
    print_header(hdr)
    for name, row in r["patterns"].items():
        print(f"{name:<12} {fmt_spread(row['kafka_python_ms'], '.3f'):>24} {fmt_spread(row['librdkafka_ms'], '.3f'):>24} "
              f"{fmt_spread(row['kafka_python_over_librdkafka'], '.1f'):>22}  {what[name]}")
    print(f"client process CPU per paced request, median (min-max) of {r['repeats']} repetitions, one embedded broker")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 repetition, a tenth of the requests (a smoke run)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats = 1
    elif args.repeats < 3:
        ap.error("--repeats must be >= 3 (the table shows median and spread)")
    try:
        import confluent_kafka
    except ImportError as e:
        ap.error(f"{e.name} is not installed: pip install -e '.[bench]'")
    patterns = tuple(p._replace(count=max(5, p.count // 10)) if args.quick else p for p in PATTERNS)
    from astraflow.topics import EmbeddedBroker, TopicSpec, ensure_topics

    load_before = load_now()
    with EmbeddedBroker(heap="768m").start() as broker:
        bootstrap = broker.bootstrap_servers

        def new_topic() -> str:
            name = f"bench-{uuid.uuid4().hex[:10]}"
            ensure_topics(bootstrap, [TopicSpec(name, max_message_bytes=8 * CHUNK)])
            return name
        reps = [one_repetition(bootstrap, rep, patterns, new_topic) for rep in range(args.repeats)]
    r = {"benchmark": "kafka_clients", "repeats": args.repeats, "quick": args.quick,
         "clients": {"kafka-python": metadata.version("kafka-python"), "librdkafka": confluent_kafka.libversion()[0],
                     "confluent-kafka": confluent_kafka.__version__},
         "requests": {p.name: {"count": p.count, "per_s": p.per_s, "bytes": p.size, "what": p.what} for p in patterns},
         "patterns": aggregate(reps)}
    print_table(r)
    write_results(args.out, r, load_before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
