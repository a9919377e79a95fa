"""Measure an emulation profile's efficiencies on a real GPU (``gpu_check.sh``'s profile stage).

For each model shape of ``emulation/profiles.yaml`` that fits, a random-init Qwen3 of that
shape (``transformers``, bf16, SDPA attention; nothing downloaded) is timed on this GPU:

* **decode**: one step (a forward of one new token per row over a KV cache) at batch sizes
  1-128 and contexts 512-4096 → the share of HBM bandwidth reached, ``decode_bandwidth`` =
  (weight bytes + KV bytes read) / step time / the device's HBM peak; the smallest batch's
  surplus over that is ``decode_step_overhead_s``;
* **prefill**: a batch of 2048-token prompts → ``prefill_flops`` = 2·N·tokens / time / peak;
* **training**: forward + backward + AdamW step on 2048-token rows (the smaller shape only
  when the larger one's optimizer state would not fit) → ``train_flops`` = 6·N·tokens / time
  / peak;
* **weight load**: the bf16 state dict from pinned host memory to the device and into the
  model (``load_state_dict``) → ``weight_sync_bytes_per_s``;
* **offload**: a 1 GiB pinned host buffer copied to the device and back → ``offload_bandwidth``
  = bytes each way / time / the device's host-link peak (what a colocated policy's swap costs).

Plain PyTorch/HF kernels, not SGLang's or FSDP's: the numbers bound what the cited estimates
claim rather than reproduce a tuned stack, and the JSON says which kernels measured them.
Writes ``benchmarks/results/gpu_profile.json`` (``--out``), which ``emulation/profile.py``
prefers to the estimates for the GPU it names. ``--cpu-smoke`` runs every stage on a tiny
shape on the CPU (it checks the script, its numbers mean nothing and go to a temp file).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from astraflow.emulation.profile import ModelSpec, load_profile, profile_names

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_profile.json"
#: tokens per forward while a decode measurement fills its KV cache (bounds activation memory)
PREFILL_CHUNK = 512


def _timed(fn, device, repeats: int = 5) -> float:
    import torch  # torch and transformers (seconds to import) in each function: --help and the tests need neither
    fn()  # warm-up (allocator, kernels)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _model(shape, device, dtype):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                      num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads,
                      num_key_value_heads=shape.num_kv_heads, head_dim=shape.head_dim, vocab_size=shape.vocab_size,
                      tie_word_embeddings=shape.tied_embeddings, max_position_embeddings=8192,
                      attn_implementation="sdpa")
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(dtype)
    return model.eval()


def measure_shape(shape, device, dtype, peak_flops: float, hbm: float, host_link: float, quick: bool) -> dict:
    import torch
    from transformers import DynamicCache
    n = shape.params
    out: dict = {"params": n, "kernels": "transformers Qwen3ForCausalLM, SDPA attention, torch " + torch.__version__}
    batches, contexts = ((1, 4), (32,)) if quick else ((1, 8, 32, 128), (512, 2048, 4096))
    out["decode"] = graph_decode(shape, device, dtype, batches, contexts, hbm)  # before the model: its own weights
    model = _model(shape, device, dtype)
    # The same steps through transformers' eager forward and DynamicCache, for reference only:
    # launch-bound (tens of ms a step at any batch) and copying the cache on every crop/append,
    # it measures that implementation, not the device; the profile does not take it.
    hf_batches, hf_contexts = ((1,), (32,)) if quick else ((1, 32), (512, 4096))
    decode = []
    with torch.no_grad():
        for ctx in hf_contexts:
            for b in hf_batches:
                ids = torch.randint(0, shape.vocab_size, (b, ctx), device=device)
                cache = DynamicCache()
                # chunked prefill into the cache, logits of the last position only: a batch of 128
                # x 4096 at once would hold ~160 GB of logits and tens of GB of activations
                for start in range(0, ctx, PREFILL_CHUNK):
                    model(input_ids=ids[:, start:start + PREFILL_CHUNK], past_key_values=cache, use_cache=True,
                          logits_to_keep=1)
                del ids
                step_ids = torch.randint(0, shape.vocab_size, (b, 1), device=device)

                def step():
                    model(input_ids=step_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                    cache.crop(-1)  # drop the new token: the same context for the next repeat
                t = _timed(step, device)
                read = 2 * n + shape.kv_bytes_per_token * b * ctx
                decode.append({"batch": b, "context": ctx, "step_s": t, "bandwidth_share": read / t / hbm})
                print(f"  decode (transformers eager) batch {b:4d} context {ctx:5d}: {t * 1e3:8.2f} ms/step, "
                      f"{read / t / hbm:.3f} of HBM peak", flush=True)
                del cache
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        out["decode_hf"] = decode
        rows, length = (2, 128) if quick else (8, 2048)
        ids = torch.randint(0, shape.vocab_size, (rows, length), device=device)
        t = _timed(lambda: model(input_ids=ids), device, repeats=3)
        out["prefill"] = {"tokens": rows * length, "seconds": t, "flops_share": 2 * n * rows * length / t / peak_flops}
    out = out | _train_and_load(model, shape, device, dtype, peak_flops, quick)
    out["offload"] = measure_host_link(device, host_link, quick)
    return out


def graph_decode(shape, device, dtype, batches, contexts, hbm: float) -> list[dict]:
    """One decode step of the shape as a serving engine runs it: one new token per row through
    every layer's projections and MLP (bf16 matmuls reading all weights) and attention over a
    KV cache of ``context`` tokens per row (SDPA's fused kernels; a KV head's query group as its
    query rows), then the LM head, captured in a CUDA graph and replayed, so no Python or
    launch overhead counts (SGLang captures its decode steps the same way). Random weights,
    no cache append (the context stays fixed between repeats); RMSNorm stands in for the
    norms. ``bandwidth_share`` = (weight bytes + KV bytes read) / step time / HBM peak."""
    import torch
    import torch.nn.functional as F
    h, inter, L = shape.hidden_size, shape.intermediate_size, shape.num_layers
    nh, nkv, hd = shape.num_heads, shape.num_kv_heads, shape.head_dim
    group = nh // nkv

    def w(*size):
        return torch.randn(*size, device=device, dtype=dtype) * 0.02

    layers = [(w((nh + 2 * nkv) * hd, h), w(h, nh * hd), w(2 * inter, h), w(h, inter)) for _ in range(L)]
    head = w(shape.vocab_size, h)
    weight_bytes = (sum(t.numel() for layer in layers for t in layer) + head.numel()) * head.element_size()
    rows = []
    for ctx in contexts:
        for b in batches:
            kv = [(w(b, nkv, ctx, hd), w(b, nkv, ctx, hd)) for _ in range(L)]
            x = w(b, h)

            def step():
                y = x
                for (qkv, o, gu, down), (k, v) in zip(layers, kv):
                    q = F.rms_norm(y, (h,)) @ qkv[: nh * hd].T  # the new token's k, v projections are
                    q = q.view(b, nkv, group, hd)               # the same reads: priced by weight_bytes
                    a = F.scaled_dot_product_attention(q, k, v)
                    y = y + a.reshape(b, nh * hd) @ o.T
                    g = F.rms_norm(y, (h,)) @ gu.T
                    y = y + (F.silu(g[:, :inter]) * g[:, inter:]) @ down.T
                return F.rms_norm(y, (h,)) @ head.T

            if device.type == "cuda":
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        step()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                t = _timed(graph.replay, device, repeats=10)
                del graph
            else:
                t = _timed(step, device)
            read = weight_bytes + shape.kv_bytes_per_token * b * ctx
            rows.append({"batch": b, "context": ctx, "step_s": t, "bandwidth_share": read / t / hbm,
                         "kernels": "CUDA graph of bf16 matmuls + SDPA" if device.type == "cuda" else "eager (smoke)"})
            print(f"  decode (graph) batch {b:4d} context {ctx:5d}: {t * 1e3:8.3f} ms/step, "
                  f"{read / t / hbm:.3f} of HBM peak", flush=True)
            del kv, x
            if device.type == "cuda":
                torch.cuda.empty_cache()
    del layers, head
    return rows


def _train_and_load(model, shape, device, dtype, peak_flops: float, quick: bool) -> dict:
    import torch
    out: dict = {}
    n = shape.params
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else float("inf")
    if 16 * n < free:  # bf16 weights + grads + fp32 Adam moments and master copy ~ 16 bytes per parameter
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.type == "cuda")
        rows, length = (2, 64) if quick else (4, 2048)
        ids = torch.randint(0, shape.vocab_size, (rows, length), device=device)

        def step():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        t = _timed(step, device, repeats=3)
        out["train"] = {"tokens": rows * length, "seconds": t, "flops_share": 6 * n * rows * length / t / peak_flops}
        del opt
        model.eval()
    else:
        out["train"] = {"skipped": f"needs ~{16 * n / 1e9:.0f} GB for weights, grads and Adam state; {free / 1e9:.0f} free"}
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    if device.type == "cuda":
        state = {k: v.pin_memory() for k, v in state.items()}
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    t = _timed(lambda: model.load_state_dict(state, strict=False), device, repeats=3)
    out["weight_load"] = {"bytes": nbytes, "seconds": t, "bytes_per_s": nbytes / t}
    return out


def measure_host_link(device, peak_bytes_per_s: float, quick: bool) -> dict:
    """Host -> device and device -> host copies of one pinned buffer; each way's share of the link's peak."""
    import torch
    n = (1 << 20) if quick else (1 << 30)
    host = torch.empty(n, dtype=torch.uint8)
    if device.type == "cuda":
        host = host.pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device=device)
    up = _timed(lambda: dev.copy_(host, non_blocking=True), device, repeats=5)
    down = _timed(lambda: host.copy_(dev, non_blocking=True), device, repeats=5)
    return {"bytes": n, "to_device_s": up, "to_host_s": down,
            "bandwidth_share": (2 * n / (up + down)) / peak_bytes_per_s}


def efficiencies(shapes: dict) -> dict:
    """The profile's efficiency entries from the measurements (the largest shape that has each)."""
    out = {}
    for name, m in sorted(shapes.items(), key=lambda item: -item[1]["params"]):
        big = [d for d in m["decode"] if d["batch"] >= 8] or m["decode"]
        out.setdefault("decode_bandwidth", statistics.median(d["bandwidth_share"] for d in big))
        small = min(m["decode"], key=lambda d: (d["batch"], d["context"]))
        out.setdefault("decode_step_overhead_s_upper", small["step_s"])
        out.setdefault("prefill_flops", m["prefill"]["flops_share"])
        if "flops_share" in m.get("train", {}):
            out.setdefault("train_flops", m["train"]["flops_share"])
        out.setdefault("weight_sync_bytes_per_s", m["weight_load"]["bytes_per_s"])
        out.setdefault("offload_bandwidth", m["offload"]["bandwidth_share"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--device-kind", default=None, help="profiles.yaml device whose peaks the shares are of "
                                                        "(default: from the GPU's name: H100 / H200)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shape on the CPU: checks the script only")
    args = ap.parse_args(argv)

    import torch
    smoke = args.cpu_smoke
    device = torch.device("cpu" if smoke else "cuda")
    if not smoke and not torch.cuda.is_available():
        print("gpu_profile: no CUDA device (use --cpu-smoke to check the script)", file=sys.stderr)
        return 2
    gpu = "cpu (smoke)" if smoke else torch.cuda.get_device_name(0)
    kind = args.device_kind or ("H200-SXM" if "H200" in gpu else "H100-SXM")
    profiles = [load_profile(p) for p in profile_names() if load_profile(p).device.name == kind]
    dev = profiles[0].device
    if smoke:
        shapes = {"tiny": ModelSpec("tiny", 64, 128, 2, 4, 2, 16, 512, True)}
    else:
        shapes = {p.model.name: p.model for p in sorted(profiles, key=lambda p: p.model.params)}
    measured, failed = {}, {}
    for name, shape in shapes.items():  # one shape failing (memory, a kernel) keeps the others' numbers
        print(f"== {name} ({shape.params / 1e9:.2f} B parameters) on {gpu}", flush=True)
        t0 = time.perf_counter()
        try:
            measured[name] = measure_shape(shape, device, torch.bfloat16 if not smoke else torch.float32,
                                           dev.bf16_dense_flops, dev.hbm_bytes_per_s, dev.host_link_bytes_per_s, smoke)
        except Exception as e:  # noqa: BLE001 - recorded in the JSON, the run goes on
            failed[name] = repr(e)[:2000]
            print(f"  FAILED: {e!r}", flush=True)
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if not measured:
        print(f"gpu_profile: no shape measured: {failed}", file=sys.stderr)
        return 1
    result = {"gpu": gpu, "device_kind": kind, "measured_at": time.strftime("%Y-%m-%d"), "smoke": smoke,
              "shapes": measured, "failed": failed, "efficiency": efficiencies(measured)}
    out = Path(tempfile.mkdtemp()) / "gpu_profile.json" if smoke else args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"{'efficiency':32} {'measured':>12}")
    for k, v in result["efficiency"].items():
        print(f"{k:32} {v:12.4g}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
