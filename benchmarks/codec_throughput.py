"""Weight codec throughput on a synthetic bf16 model with a sparse change pattern.

Measures, in one run: memory copy bandwidth (`numpy.copyto` over the model's size), full
snapshot encode/decode, sparse delta encode and decode+apply (GB/s of model weights), and
the delta's size against the raw weights and the entropy bound for its changed positions.

    python -m astraflow.benchmarks.codec_throughput                 # 1 B parameters
    python -m astraflow.benchmarks.codec_throughput --params 1e8    # quick run

Prints one table and writes benchmarks/results/codec_throughput.json.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from astraflow.benchmarks.results_io import write_results
from astraflow.engines import deltas
from astraflow.engines.weight_format import tensor_bits

RESULTS = Path(__file__).resolve().parent / "results" / "codec_throughput.json"


def make_model(params: int, n_tensors: int, seed: int) -> dict[str, torch.Tensor]:
    """Weights drawn like an initialised LLM layer (N(0, 0.02) in bf16), made in chunks."""
    gen = torch.Generator().manual_seed(seed)
    per = params // n_tensors
    return {f"layers.{i}.weight": (torch.randn(per, generator=gen) * 0.02).to(torch.bfloat16)
            for i in range(n_tensors)}


def make_step(base: dict[str, torch.Tensor], fraction: float, values: str, seed: int) -> dict[str, torch.Tensor]:
    """A copy of base with `fraction` of elements (random positions, with repeats) changed.

    values="random": new bits uniformly random (the issue's worst case for the value bytes);
    values="ulp": the last 1-3 mantissa bits flip, like a small optimizer update.
    """
    rng = np.random.default_rng(seed)
    new = {}
    for name, t in base.items():
        out = t.clone()
        bits = tensor_bits(out)
        pos = rng.integers(0, bits.size, size=round(fraction * bits.size))
        hi = 0xFFFF if values == "random" else 0x7
        bits[pos] ^= rng.integers(1, hi, size=pos.size, dtype=np.uint16, endpoint=True)
        new[name] = out
    return new


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def memcpy_gbps(model: dict[str, torch.Tensor], repeats: int) -> float:
    srcs = [tensor_bits(t) for t in model.values()]
    dst = np.empty(sum(s.size for s in srcs), np.uint16)
    dst.fill(0)  # fault the pages in first: we want bandwidth, not page-fault cost

    def copy_all() -> None:
        at = 0
        for s in srcs:
            np.copyto(dst[at : at + s.size], s)
            at += s.size

    best = min(timed(copy_all)[0] for _ in range(repeats))
    return dst.nbytes / best / 1e9


def run(params: int, n_tensors: int, fraction: float, values: str, threads: int, level: int) -> dict[str, Any]:
    base = make_model(params, n_tensors, seed=0)
    raw = sum(t.numel() * t.element_size() for t in base.values())
    gb = raw / 1e9
    r: dict[str, Any] = {"params": sum(t.numel() for t in base.values()), "tensors": n_tensors, "dtype": "bfloat16",
                         "changed_fraction_target": fraction, "values": values, "threads": threads,
                         "zstd_level": level, "raw_bytes": raw}
    r["memcpy_gbps"] = memcpy_gbps(base, repeats=3)

    t, snap = timed(lambda: deltas.encode_version(base, 0, level=level, threads=threads))
    r["snapshot_encode_gbps"], r["snapshot_bytes"] = gb / t, snap.nbytes
    snap_bytes = snap.to_bytes()
    base_hashes = snap.tensor_hashes
    del snap
    t, _ = timed(lambda: deltas.decode(snap_bytes, threads=threads))
    r["snapshot_decode_gbps"] = gb / t
    del snap_bytes

    new = make_step(base, fraction, values, seed=1)
    t, cold = timed(lambda: deltas.encode_version(new, 1, base=base, base_version=0, threads=threads))
    r["delta_encode_gbps_hashing_base"] = gb / t
    del cold
    # Steady state: the publisher kept the previous version's hashes, so the base is not re-hashed.
    t, ev = timed(lambda: deltas.encode_version(new, 1, base=base, base_version=0,
                                                base_hashes=base_hashes, threads=threads))
    r["delta_encode_gbps"] = gb / t
    stats = ev.stats
    payload = ev.to_bytes()
    del ev, new

    live = {k: v.clone() for k, v in base.items()}
    t, new_hashes = timed(lambda: deltas.apply_in_place(payload, live, base_hashes=base_hashes, threads=threads))
    r["delta_apply_gbps"] = gb / t
    for k, v in live.items():
        v.copy_(base[k])
    t, _ = timed(lambda: deltas.apply_in_place(payload, live, threads=threads))
    r["delta_apply_gbps_hashing_base"] = gb / t
    for k, v in live.items():
        v.copy_(base[k])
    t, _ = timed(lambda: deltas.apply_in_place(payload, live, base_hashes=base_hashes, verify=False, threads=threads))
    r["delta_apply_gbps_unverified"] = gb / t
    assert deltas.weights_digest(live, new_hashes) == deltas.read_header(payload).digest

    k, n = stats.changed_elements, stats.total_elements
    r.update({
        "changed_elements": k, "changed_fraction": k / n, "delta_bytes": len(payload),
        "delta_encodings": sorted({e.value for e in stats.encodings.values()}),
        "entropy_bound_bytes_per_tensor_sum": stats.entropy_bound_nbytes,
        "entropy_bound_bytes_whole_model": deltas.entropy_bound_bytes(n, k, 2),
        "values_raw_bytes": 2 * k,
    })
    r["delta_over_entropy_bound"] = len(payload) / stats.entropy_bound_nbytes
    r["delta_over_raw"] = len(payload) / raw
    return r


def print_table(r: dict[str, Any]) -> None:
    gb = r["raw_bytes"] / 1e9
    rows = [
        ("model", f"{r['params'] / 1e9:.2f} B params bf16, {r['tensors']} tensors, {gb:.2f} GB"),
        ("changed", f"{r['changed_elements']:,} elements ({r['changed_fraction']:.3%}), {r['values']} new bits"),
        ("memcpy (numpy.copyto)", f"{r['memcpy_gbps']:.2f} GB/s"),
        ("snapshot encode", f"{r['snapshot_encode_gbps']:.2f} GB/s  ({r['snapshot_encode_gbps'] / r['memcpy_gbps']:.0%} of memcpy)"),
        ("snapshot decode", f"{r['snapshot_decode_gbps']:.2f} GB/s"),
        ("snapshot bytes", f"{r['snapshot_bytes'] / 1e9:.3f} GB ({r['snapshot_bytes'] / r['raw_bytes']:.1%} of raw)"),
        ("delta encode (cached base hashes)", f"{r['delta_encode_gbps']:.2f} GB/s  ({r['delta_encode_gbps'] / r['memcpy_gbps']:.0%} of memcpy)"),
        ("delta encode (hashing base)", f"{r['delta_encode_gbps_hashing_base']:.2f} GB/s"),
        ("delta decode+apply (cached, verified)", f"{r['delta_apply_gbps']:.2f} GB/s  ({r['delta_apply_gbps'] / r['memcpy_gbps']:.0%} of memcpy)"),
        ("delta decode+apply (hashing base)", f"{r['delta_apply_gbps_hashing_base']:.2f} GB/s"),
        ("delta decode+apply (no result check)", f"{r['delta_apply_gbps_unverified']:.2f} GB/s"),
        ("delta bytes", f"{r['delta_bytes'] / 1e6:.1f} MB ({r['delta_over_raw']:.2%} of raw), encodings {','.join(r['delta_encodings'])}"),
        ("entropy bound (per tensor)", f"{r['entropy_bound_bytes_per_tensor_sum'] / 1e6:.1f} MB -> delta is {r['delta_over_entropy_bound']:.3f}x the bound"),
        ("  of which raw values", f"{r['values_raw_bytes'] / 1e6:.1f} MB"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=1e9, help="model size in parameters (default 1e9)")
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--fraction", type=float, default=0.01, help="share of elements changed")
    ap.add_argument("--values", choices=["random", "ulp"], default="random")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--level", type=int, default=deltas.DEFAULT_LEVEL, help="zstd level")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.manual_seed(0)
    r = run(int(args.params), args.tensors, args.fraction, args.values, args.threads, args.level)
    r["machine"] = {"torch": torch.__version__, "numpy": np.__version__}
    print_table(r)
    write_results(args.out, r)


if __name__ == "__main__":
    main()
