"""Is a link's bandwidth shared by its connections? Three shapers at the same rate, measured.

``k`` connections each send ``N`` bytes at once through a link of rate ``r`` toward a sink
that answers when it has them all; the time until every answer is in gives the aggregate
rate. A link shared by its connections keeps the aggregate at ``r`` whatever ``k``; a cap per
connection lets ``k`` connections move ``k * r``.

- ``netns_tbf``: :class:`astraflow.topology.links.RegionLink` (veth + ``tc tbf`` per direction,
  a Toxiproxy with no toxic in the path), from inside the region's namespace;
- ``toxiproxy_bandwidth``: Toxiproxy's own ``bandwidth`` toxic on the upstream stream;
- ``shaped_proxy``: the home-made :class:`astraflow.benchmarks.shaped_proxy.ShapedProxy`.

    python -m astraflow.benchmarks.wan_links

Prints one table and writes benchmarks/results/wan_links.json.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.stats import fmt_spread, spread
from astraflow.topology.links import RegionLink, Toxiproxy
from astraflow.benchmarks.shaped_proxy import ShapedProxy

RESULTS = Path(__file__).resolve().parent / "results" / "wan_links.json"
ACK = b"ok"


def _recv_exactly(s: socket.socket, n: int) -> None:
    left = n
    while left:
        chunk = s.recv(min(65536, left))
        if not chunk:
            raise ConnectionError(f"closed {left} bytes short of {n}")
        left -= len(chunk)


@contextlib.contextmanager
def _sink(n: int):
    """A loopback server that reads ``n`` bytes per connection and answers ACK; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)

    def serve(conn: socket.socket) -> None:
        with contextlib.suppress(OSError, ConnectionError), conn:
            _recv_exactly(conn, n)
            conn.sendall(ACK)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def timed_transfer(dial: Callable[[], socket.socket], connections: int, n: int) -> float:
    socks = [dial() for _ in range(connections)]
    errors: list[BaseException] = []

    def send(s: socket.socket) -> None:
        try:
            s.sendall(b"x" * n)
            _recv_exactly(s, len(ACK))
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)
    threads = [threading.Thread(target=send, args=(s,)) for s in socks]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    took = time.monotonic() - t
    for s in socks:
        s.close()
    if errors:
        raise errors[0]
    return took


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate-mbps", type=float, default=8.0)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="each way, on every shaper")
    ap.add_argument("--bytes", type=int, default=400_000, help="per connection")
    ap.add_argument("--connections", type=int, nargs="+", default=[1, 2, 6])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    n, rate, latency = args.bytes, args.rate_mbps, args.latency_ms
    before = load_now()
    results: dict[str, dict[str, dict]] = {}
    with _sink(n) as port, Toxiproxy() as tp:
        link = RegionLink("bench", bandwidth_mbps=rate, latency_ms=latency, toxiproxy=tp)
        try:
            fwd = link.reach(port)
            tp.create("bw", f"127.0.0.1:{port}")
            tp_port = int(tp.show("bw")["listen"].rsplit(":", 1)[1])
            tp.add_toxic("bw", "bandwidth_up", "bandwidth", "upstream", rate=int(rate * 1000 / 8))  # KB/s
            if latency:
                tp.add_latency("bw", latency)
            with ShapedProxy(port, latency_ms=latency, bandwidth_mbps=rate, name="bench") as sp:
                dials = {
                    "netns_tbf": lambda: link.connect((fwd.host, fwd.port)),
                    "toxiproxy_bandwidth": lambda: socket.create_connection(("127.0.0.1", tp_port), timeout=10),
                    "shaped_proxy": lambda: socket.create_connection(("127.0.0.1", sp.port), timeout=10),
                }
                for k in args.connections:
                    runs: dict[str, list[float]] = {name: [] for name in dials}
                    for _ in range(args.repeats):  # the shapers alternate run by run
                        for name, dial in dials.items():
                            runs[name].append(timed_transfer(dial, k, n))
                    for name, secs in runs.items():
                        results.setdefault(name, {})[str(k)] = {
                            "seconds": spread(secs),
                            "aggregate_mbps": spread([k * n * 8 / s / 1e6 for s in secs]),
                            "shared_link_floor_s": k * n * 8 / (rate * 1e6)}
        finally:
            link.close()
    print(f"{n} B per connection, link {rate:g} Mbit/s, {latency:g} ms each way; aggregate Mbit/s "
          "median (min-max); a shared link stays at its rate")
    print(f"{'shaper':22s}" + "".join(f"{f'{k} conn':>22s}" for k in args.connections))
    for name, per_k in results.items():
        print(f"{name:22s}" + "".join(f"{fmt_spread(per_k[str(k)]['aggregate_mbps'], '.1f'):>22s}"
                                      for k in args.connections))
    data = {"rate_mbps": rate, "latency_ms": latency, "bytes_per_connection": n, "repeats": args.repeats, "shapers": results,
            "toxiproxy_version": tp.version}
    write_results(args.out, data, before)
    return data


if __name__ == "__main__":
    main()
