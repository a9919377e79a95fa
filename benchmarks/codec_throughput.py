"""Weight codec throughput on a synthetic bf16 model with a sparse change pattern.

Owns the codec measurements that ``weight_transfer.py`` reuses, so a number has one
definition: :func:`delta_codec` (memcpy, delta encode, delta decode+apply, each as GB/s
of model weights, the memcpy with the codec's own thread count, repeated and paired
run by run) and :func:`entropy_estimate` (what the delta's size is compared with). This
script adds what only the codec page needs: full snapshot encode/decode and the cost of
the codec's options (re-hashing the base, skipping the result check).

docs/benchmarks.md quotes the delta encode/decode numbers from ``weight_transfer.json`` (which
calls :func:`delta_codec` in its own run); ``codec_throughput.json`` holds the same
measurement from this script's run, so the two differ only by run (time and load, both
recorded).

    python -m astraflow.benchmarks.codec_throughput                 # 1 B parameters
    python -m astraflow.benchmarks.codec_throughput --quick         # 1e8, a smoke run

Prints one table and writes benchmarks/results/codec_throughput.json.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from astraflow.benchmarks.lib.results import load_now, write_results
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread
from astraflow.benchmarks.lib.table import print_pairs
from astraflow.weights import codec
from astraflow.weights.format import tensor_bits

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


# ---------------------------------------------------------------- reference lines


class Memcpy:
    """``numpy.copyto`` of the model's bits, split over ``threads`` threads (numpy releases
    the GIL on large copies): the bandwidth the codec is measured against, with the same
    thread count the codec uses. Copies into ``dst`` (same names and sizes) when given —
    the codec benchmark restores its working copy this way — else into one new buffer."""

    def __init__(self, model: Mapping[str, torch.Tensor], threads: int,
                 dst: Mapping[str, torch.Tensor] | None = None) -> None:
        self.threads = max(1, threads)
        if dst is None:
            buf = np.empty(sum(t.numel() for t in model.values()), np.uint16)
            buf.fill(0)  # fault the pages in first: we want bandwidth, not page-fault cost
            outs, at = [], 0
            for t in model.values():
                outs.append(buf[at:at + t.numel()])
                at += t.numel()
        else:
            outs = [tensor_bits(dst[name]) for name in model]
        self.nbytes = sum(t.numel() * t.element_size() for t in model.values())
        self.jobs = []
        for t, out in zip(model.values(), outs):
            src = tensor_bits(t)
            if out.size != src.size:
                raise ValueError(f"memcpy destination holds {out.size} elements, source {src.size}")
            step = math.ceil(src.size / self.threads)
            self.jobs += [(out[i:i + step], src[i:i + step]) for i in range(0, src.size, step)]

    def gbps(self) -> float:
        def copy(job: tuple[np.ndarray, np.ndarray]) -> None:
            np.copyto(*job)

        t0 = time.perf_counter()
        if self.threads == 1:
            for job in self.jobs:
                copy(job)
        else:
            with ThreadPoolExecutor(self.threads) as pool:
                list(pool.map(copy, self.jobs))
        return self.nbytes / (time.perf_counter() - t0) / 1e9


def _plane_entropy_bits(values: np.ndarray) -> float:
    """Order-0 empirical entropy, in bits, of each byte plane of ``values``, summed over
    values (``k * sum_j H(byte j)``)."""
    if values.size == 0:
        return 0.0
    planes = values.view(np.uint8).reshape(values.size, values.itemsize)
    total = 0.0
    for j in range(values.itemsize):
        counts = np.bincount(planes[:, j], minlength=256)
        p = counts[counts > 0] / values.size
        total += float(-(p * np.log2(p)).sum()) * values.size
    return total


def entropy_estimate(base: Mapping[str, torch.Tensor] | None, new: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """An empirical entropy estimate of a delta's content, per tensor, summed.

    Change mask: ``log2 C(n, k)`` bits (the positions' entropy if every set of k changed
    positions were equally likely). Values: the order-0 empirical entropy of each byte
    plane of the k new values (the codec stores new bits byte-planed). It is an estimate,
    not a bound: a coder that uses context (zstd's matches, correlated positions) can go
    below it. ``base=None`` estimates a full snapshot (every element is a value, no mask).
    """
    mask_bits = values_bits = 0.0
    k_total = n_total = 0
    for name, t in new.items():
        bits = tensor_bits(t)
        n = bits.size
        if base is None:
            changed = bits
        else:
            changed = bits[tensor_bits(base[name]) != bits]
            k = changed.size
            mask_bits += (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2)
        values_bits += _plane_entropy_bits(np.ascontiguousarray(changed))
        k_total += changed.size
        n_total += n
    return {"mask_bytes": math.ceil(mask_bits / 8), "values_bytes": math.ceil(values_bits / 8),
            "bytes": math.ceil(mask_bits / 8) + math.ceil(values_bits / 8), "changed": k_total,
            "elements": n_total}


# ---------------------------------------------------------------- measurements


def delta_codec(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor], threads: int, repeats: int,
                level: int | None = codec.DEFAULT_LEVEL) -> dict[str, Any]:
    """Memcpy, delta encode and delta decode+apply (verified), GB/s of model weights.

    Steady state as in the publisher and subscriber: both keep the previous version's
    tensor hashes, so the base is not re-hashed. The first round is reported as ``cold``;
    then ``repeats`` rounds of (memcpy, encode, apply), so the ``*_vs_memcpy`` ratios pair
    measurements taken seconds apart.
    """
    gb = sum(t.numel() * t.element_size() for t in base.values()) / 1e9
    base_hashes = codec.tensor_hashes(base, threads)
    live = {k: v.clone() for k, v in base.items()}
    memcpy = Memcpy(base, threads, dst=live)  # each memcpy puts the base back into the working copy
    payload, stats = b"", None

    def round_() -> tuple[float, float, float]:
        nonlocal payload, stats
        m = memcpy.gbps()
        t_enc, ev = timed(lambda: codec.encode_version(new, 1, base=base, base_version=0,
                                                       base_hashes=base_hashes, threads=threads, level=level))
        payload, stats = ev.to_bytes(), ev.stats
        del ev
        t_apply, _ = timed(lambda: codec.apply_in_place(payload, live, base_hashes=base_hashes, threads=threads))
        return m, gb / t_enc, gb / t_apply

    cold = round_()
    rounds = [round_() for _ in range(repeats)]
    del live, memcpy
    mem, enc, dec = (spread([r[i] for r in rounds]) for i in range(3))
    est = entropy_estimate(base, new)
    return {"threads": threads, "zstd_level": level, "repeats": repeats,
            "cold": {"memcpy_gbps": cold[0], "delta_encode_gbps": cold[1], "delta_apply_gbps": cold[2]},
            "memcpy_gbps": mem, "delta_encode_gbps": enc, "delta_apply_gbps": dec,
            "encode_vs_memcpy": ratio_spread(enc, mem), "decode_vs_memcpy": ratio_spread(dec, mem),
            "changed_elements": stats.changed_elements, "changed_fraction": stats.changed_fraction,
            "delta_bytes": len(payload), "delta_encodings": sorted({t.label for t in stats.tensors}),
            "entropy_estimate": est, "delta_over_entropy_estimate": len(payload) / est["bytes"]}


def snapshot_and_options(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor], threads: int, repeats: int,
                         level: int) -> dict[str, Any]:
    """Full snapshot encode/decode, and what the delta codec's options cost (GB/s)."""
    gb = sum(t.numel() * t.element_size() for t in base.values()) / 1e9

    def snap_round() -> tuple[float, float, int]:
        t, snap = timed(lambda: codec.encode_version(base, 0, level=level, threads=threads))
        nbytes, data = snap.nbytes, snap.to_bytes()
        del snap
        t_dec, _ = timed(lambda: codec.decode(data, threads=threads))
        return gb / t, gb / t_dec, nbytes

    snaps = [snap_round() for _ in range(repeats + 1)][1:]  # the first is cold
    payload = codec.encode_version(new, 1, base=base, base_version=0, threads=threads).to_bytes()
    base_hashes = codec.tensor_hashes(base, threads)
    live = {k: v.clone() for k, v in base.items()}

    def apply(**kw) -> float:
        for k, v in live.items():
            v.copy_(base[k])
        return gb / timed(lambda: codec.apply_in_place(payload, live, threads=threads, **kw))[0]

    hashing_enc = [gb / timed(lambda: codec.encode_version(new, 1, base=base, base_version=0,
                                                           threads=threads))[0] for _ in range(repeats)]
    return {"snapshot_encode_gbps": spread([s[0] for s in snaps]), "snapshot_decode_gbps": spread([s[1] for s in snaps]),
            "snapshot_bytes": snaps[0][2], "snapshot_entropy_estimate": entropy_estimate(None, base),
            "delta_encode_gbps_hashing_base": spread(hashing_enc),
            "delta_apply_gbps_hashing_base": spread([apply() for _ in range(repeats)]),
            "delta_apply_gbps_unverified": spread([apply(base_hashes=base_hashes, verify=False)
                                                   for _ in range(repeats)])}


def print_table(r: dict[str, Any]) -> None:
    gb = r["raw_bytes"] / 1e9
    d = r["delta"]
    rows = [
        ("model", f"{r['params'] / 1e9:.2f} B params bf16, {r['tensors']} tensors, {gb:.2f} GB"),
        ("changed", f"{d['changed_elements']:,} elements ({d['changed_fraction']:.3%}), {r['values']} new bits"),
        (f"memcpy (numpy.copyto, {d['threads']} threads)", f"{fmt_spread(d['memcpy_gbps'])} GB/s"),
        ("delta encode (cached base hashes)", f"{fmt_spread(d['delta_encode_gbps'])} GB/s  "
                                              f"(vs memcpy {fmt_spread(d['encode_vs_memcpy'], '.3f')})"),
        ("delta decode+apply (cached, verified)", f"{fmt_spread(d['delta_apply_gbps'])} GB/s  "
                                                  f"(vs memcpy {fmt_spread(d['decode_vs_memcpy'], '.3f')})"),
        ("delta bytes", f"{d['delta_bytes'] / 1e6:.1f} MB ({d['delta_bytes'] / r['raw_bytes']:.2%} of raw), "
                        f"encodings {','.join(d['delta_encodings'])}"),
        ("entropy estimate (mask + byte planes)", f"{d['entropy_estimate']['bytes'] / 1e6:.1f} MB -> delta is "
                                                  f"{d['delta_over_entropy_estimate']:.3f}x the estimate"),
    ]
    if "options" in r:
        o = r["options"]
        rows += [
            ("snapshot encode", f"{fmt_spread(o['snapshot_encode_gbps'])} GB/s"),
            ("snapshot decode", f"{fmt_spread(o['snapshot_decode_gbps'])} GB/s"),
            ("snapshot bytes", f"{o['snapshot_bytes'] / 1e9:.3f} GB ({o['snapshot_bytes'] / r['raw_bytes']:.1%} of raw; "
                               f"estimate {o['snapshot_entropy_estimate']['bytes'] / 1e9:.3f} GB)"),
            ("delta encode (hashing base)", f"{fmt_spread(o['delta_encode_gbps_hashing_base'])} GB/s"),
            ("delta decode+apply (hashing base)", f"{fmt_spread(o['delta_apply_gbps_hashing_base'])} GB/s"),
            ("delta decode+apply (no result check)", f"{fmt_spread(o['delta_apply_gbps_unverified'])} GB/s"),
        ]
    print_pairs(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=1e9, help="model size in parameters (default 1e9)")
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--fraction", type=float, default=0.01, help="share of elements changed")
    ap.add_argument("--values", choices=["random", "ulp"], default="random")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--level", type=int, default=codec.DEFAULT_LEVEL,
                    help="zstd level (default: the codec's tuned weight parameters)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1e8 parameters (a smoke run)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.params = min(args.params, 1e8)
    if args.repeats < 3:
        ap.error("--repeats must be >= 3 (the tables show median and spread)")
    load_before = load_now()
    torch.manual_seed(0)
    base = make_model(int(args.params), args.tensors, seed=0)
    new = make_step(base, args.fraction, args.values, seed=1)
    r: dict[str, Any] = {"benchmark": "codec_throughput", "params": sum(t.numel() for t in base.values()),
                         "tensors": args.tensors, "dtype": "bfloat16", "changed_fraction_target": args.fraction,
                         "values": args.values, "raw_bytes": sum(t.numel() * t.element_size() for t in base.values()),
                         "same_measurement_as": "weight_transfer.json 'synthetic' (delta_codec); differs only by run"}
    r["delta"] = delta_codec(base, new, args.threads, args.repeats, args.level)
    r["options"] = snapshot_and_options(base, new, args.threads, args.repeats, args.level)
    r["machine"] = {"torch": torch.__version__, "numpy": np.__version__}
    print_table(r)
    write_results(args.out, r, load_before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
