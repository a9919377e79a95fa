"""Render the README's results section from ``benchmarks/results/*.json``.

``python benchmarks/report.py`` prints the markdown; ``--update-readme`` replaces the text
between the ``<!-- results:start -->`` and ``<!-- results:end -->`` markers, so the README's
numbers are always the benchmarks' own.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "benchmarks" / "results"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def _load(name: str) -> dict | None:
    p = RES / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def topics() -> list[str]:
    d = _load("topics_throughput")
    if not d:
        return []
    out = [f"**Kafka path** — `python benchmarks/topics_throughput.py` (Kafka {d['kafka_version']}, "
           f"{d['records']:,} trajectory records of ~{d['trajectory_value_bytes']:,} B, "
           f"{d['chunk_total_mib']} MiB of 1 MiB chunks; ours = typed wrappers with orjson, idempotence, "
           "acks=all, zstd / chunking with sha256; Kafka = its own perf tools, same payloads and settings)", "",
           "| workload | op | ours rec/s | ours MB/s | Kafka tool rec/s | Kafka tool MB/s | ours/Kafka |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in d["rows"]:
        out.append(f"| {r['workload']} | {r['op']} | {r['ours_records_per_s']:,.0f} | {r['ours_MB_per_s']:.1f} | "
                   f"{r['kafka_records_per_s']:,.0f} | {r['kafka_MB_per_s']:.1f} | {r['ratio']:.2f} |")
    return out + [""]


def engine() -> list[str]:
    d = _load("engine_throughput")
    if not d:
        return []
    out = ["**Rollout engine** — `python -m astraflow.benchmarks.engine_throughput --threads 1` "
           f"(tiny model, {d['env']['parameters']:,} params, {d['env']['threads']} thread)", "",
           "| workload (batch 64) | CPU engine tok/s | `transformers.generate` tok/s | speedup |", "|---|---:|---:|---:|"]
    for r in d["generation"]:
        out.append(f"| {r['workload']} | {r['cpu_engine_tok_per_s']:,.0f} | {r['hf_generate_tok_per_s']:,.0f} | "
                   f"{r['speedup']:.2f}x |")
    out += ["", "| DeepSpeed trainer (CPU) | samples/step | s/step | samples/s |", "|---|---:|---:|---:|"]
    for r in d["training"]:
        out.append(f"| ZeRO stage {r['zero_stage']} | {r['samples']} | {r['step_s']:.3f} | {r['samples_per_s']:.0f} |")
    return out + [""]


def weights() -> list[str]:
    d = _load("weight_transfer")
    if not d:
        return []
    rl, syn, lat = d["rl"], d["synthetic"], d["latency"]
    out = ["**Weight transfer** — `python -m astraflow.benchmarks.weight_transfer` (real GRPO steps of the "
           f"DeepSpeed CPU trainer, {rl['info']['params']:,} params; synthetic {syn['params'] / 1e9:.0f} B-parameter "
           "bf16 model with 1 % of elements changed)", "",
           "| measurement | fp32 (as trained on CPU) | bf16 (as a GPU engine holds it) |", "|---|---:|---:|"]
    f, b = rl["fp32"], rl["bf16"]
    out.append(f"| changed elements per step (mean) | {f['changed_fraction']:.1%} | {b['changed_fraction']:.1%} |")
    out.append(f"| delta bytes / full snapshot bytes | {f['delta_over_snapshot']:.3f} | {b['delta_over_snapshot']:.3f} |")
    out.append(f"| delta bytes / entropy bound | {f['delta_over_entropy_bound']:.3f} | {b['delta_over_entropy_bound']:.3f} |")
    out += ["", "| 1 B bf16, 1 % changed | GB/s of weights | vs memcpy |", "|---|---:|---:|",
            f"| memcpy (`numpy.copyto`) | {syn['memcpy_gbps']:.2f} | 1.00 |",
            f"| delta encode | {syn['delta_encode_gbps']:.2f} | {syn['delta_encode_gbps'] / syn['memcpy_gbps']:.3f} |",
            f"| delta decode + apply (verified) | {syn['delta_apply_gbps']:.2f} | "
            f"{syn['delta_apply_gbps'] / syn['memcpy_gbps']:.3f} |",
            "", "| publish → all subscribers hold it | delta | full snapshot |", "|---|---:|---:|"]
    for key, label in (("tiny", "tiny model"), ("big", "1 B model")):
        x = lat.get(key)
        if x:
            out.append(f"| {label} ({x['subscribers']} subscribers) | {x['delta_s']:.2f} s ({x['delta_bytes'] / 1e6:.1f} MB) | "
                       f"{x['full_s']:.2f} s ({x['full_bytes'] / 1e6:.1f} MB) |")
    return out + [""]


def scaling() -> list[str]:
    d = _load("trainer_scaling")
    if not d:
        return []
    m, s = d["model"], d["settings"]
    out = [f"**Trainer scaling** — `python -m astraflow.benchmarks.trainer_scaling` (DeepSpeed on CPU, gloo, ranks "
           f"started by torch's launcher; random-init Qwen3 of {m['parameters'] / 1e6:.0f} M params, fp32 AdamW; the "
           f"same batch of {s['samples']} × {s['tokens_per_sample']} tokens; {s['threads_per_rank']} torch thread per "
           f"rank; median (min–max) of {s['timed_steps']} steps after a dropped warm-up; 1-minute load average "
           f"{d['load']['before']['loadavg'][0]:.1f} → {d['load']['after']['loadavg'][0]:.1f} on {d['machine']['cpus']} "
           "cores)", "",
           "| ranks | ZeRO | samples/s (min–max) | vs 1 rank | CPU s per step, busiest rank | peak RSS per rank | "
           "RSS after the steps |", "|---:|---:|---:|---:|---:|---:|---:|"]
    one = {r["zero_stage"]: r for r in d["rows"] if r["ranks"] == 1 and "error" not in r}
    for r in d["rows"]:
        if "error" in r:
            out.append(f"| {r['ranks']} | {r['zero_stage']} | failed | | | | |")
            continue
        base = one.get(r["zero_stage"])
        vs = f"{r['samples_per_s'] / base['samples_per_s']:.2f}x" if base else ""
        out.append(f"| {r['ranks']} | {r['zero_stage']} | {r['samples_per_s']:.2f} ({r['samples_per_s_min']:.2f}–"
                   f"{r['samples_per_s_max']:.2f}) | {vs} | {r['rank_cpu_s']['median']:.1f} | {r['peak_rss_mb']:,.0f} MB | "
                   f"{r['rss_after_mb']:,.0f} MB |")
    return out + [""]


def async_sync() -> list[str]:
    d = _load("async_vs_sync")
    if not d:
        return []
    out = [f"**Async vs sync** — `python benchmarks/async_vs_sync.py` (the demo job, {d['steps']} steps each, "
           "same broker and machine; steady state after step 2)", "",
           "| mode | s/step | rollout busy | trainer busy | R s/step | T s/step | ideal (R+T)/max(R,T) | speedup | "
           "accuracy v0 → final |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for mode, r in d["results"].items():
        sp = f"{d['speedup']:.2f}x" if mode == "async" else "1.00x"
        out.append(f"| {mode} | {r['s_per_step']:.2f} | {r['rollout_busy_frac']:.2f} | {r['trainer_busy_frac']:.2f} | "
                   f"{r['R_s']:.2f} | {r['T_s']:.2f} | {r['ideal_overlap']:.2f} | {sp} | "
                   f"{r['accuracy_initial']:.3f} → {r['accuracy_final']:.3f} |")
    return out + [""]


def demo() -> list[str]:
    d = _load("demo_run")
    if not d:
        return []
    acc = " → ".join(f"v{v}: {a:.3f}" for v, a in d["accuracy_by_version"].items())
    return [f"**Demo** — `make demo` ({d['steps_trained']} versions in {d['wall_s']:.0f} s wall, "
            f"{d['samples_trained']:,} samples trained, async, 1 RaaS node): held-out pass@1 "
            f"(200 problems × 4 samples, T=0.6) {acc}{_gap(d)}", "",
            "![demo run](benchmarks/results/demo_plot.png)", ""]


def _gap(d: dict) -> str:
    if d.get("train_inference_logp_gap") is None:
        return ""
    return (f". Training–inference log-prob gap (mean |logp_trainer − logp_behaviour| over tokens generated at "
            f"the trained version, {d['train_inference_logp_gap_steps']} steps): "
            f"{d['train_inference_logp_gap']:.1e} (max {d['train_inference_logp_gap_max']:.1e})")


def render() -> str:
    return "\n".join(demo() + async_sync() + topics() + weights() + engine() + scaling()).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update-readme", action="store_true")
    args = ap.parse_args()
    text = render()
    if not args.update_readme:
        print(text)
        return 0
    readme = ROOT / "README.md"
    s = readme.read_text()
    i, j = s.index(START) + len(START), s.index(END)
    readme.write_text(s[:i] + "\n" + text + s[j:])
    print(f"updated {readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
