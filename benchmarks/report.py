"""Render the results section of ``docs/benchmarks.md`` from ``benchmarks/results/*.json``.

``python benchmarks/report.py`` prints the markdown; ``--update-docs`` replaces the text
between the ``<!-- results:start -->`` and ``<!-- results:end -->`` markers of
``docs/benchmarks.md``, so its numbers are always the benchmarks' own (the README's short
results table quotes them by hand).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from astraflow.benchmarks.results_io import fmt_spread as _sp

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
    large = (f", {d['large_records']:,} of 8 x {d.get('large_tokens', 512)} tokens (~{d['large_value_bytes']:,} B)"
             if d.get("large_records") else "")
    out = [f"**Kafka path** — `python -m astraflow.benchmarks.topics_throughput` (Kafka {d['kafka_version']}, "
           f"{d['records']:,} trajectory records of ~{d['trajectory_value_bytes']:,} B{large}, "
           f"{d['chunk_total_mib']} MiB of 1 MiB chunks; ours = typed wrappers with orjson, idempotence, "
           "acks=all, zstd / chunking with BLAKE3; kafka-python = the same client with the same settings and bytes, "
           "no decoding or checksums; Kafka tool = its own perf tools, same payloads and settings; 4 KiB reads = "
           "plain kafka-python consuming with its stock socket reads instead of `topics/socket_reads.py`'s; "
           "packed / JSON arrays = our consumer on the same groups with packed number arrays (schema 3) over "
           "JSON arrays (schema 2), records/s; C reader / kafka-python = plain kafka-python reading the same records "
           "with our C record reader (`topics/records.py`, which our consumers use) over kafka-python's own reading, "
           f"records/s; MB/s median (min–max) of {d['repeats']} rounds{_load_note(d)})", "",
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


def engine() -> list[str]:
    d = _load("engine_throughput")
    if not d:
        return []
    out = ["**Rollout engine** — `python -m astraflow.benchmarks.engine_throughput --threads 1` "
           f"(tiny model, {d['env']['parameters']:,} params, {d['env']['threads']} thread; both sides generate the "
           f"same rows to the same lengths, so the same tokens; median (min–max) of {d['repeats']} alternating warm "
           f"calls after a cold one{_load_note(d)})", "",
           f"| workload (batch {d['batch']}) | tokens | CPU engine tok/s | `transformers.generate` tok/s | speedup |",
           "|---|---:|---:|---:|---:|"]
    for r in d["generation"]:
        out.append(f"| {r['workload']} | {r['tokens']:,} | {_sp(r['cpu_engine_tok_per_s'], ',.0f')} | "
                   f"{_sp(r['hf_generate_tok_per_s'], ',.0f')} | {_sp(r['speedup'])}x |")
    out += ["", "| DeepSpeed trainer (CPU) | samples/step | warm s/step | cold first step s |", "|---|---:|---:|---:|"]
    for r in d["training"]:
        out.append(f"| ZeRO stage {r['zero_stage']} | {r['samples']} | {_sp(r['step_s'], '.3f')} | {r['cold_step_s']:.3f} |")
    return out + [""]


def weights() -> list[str]:
    d = _load("weight_transfer")
    if not d:
        return []
    rl, syn, lat = d["rl"], d["synthetic"], d["latency"]
    out = ["**Weight transfer** — `python -m astraflow.benchmarks.weight_transfer` (real GRPO steps of the "
           f"DeepSpeed CPU trainer, {rl['info']['params']:,} params; synthetic {syn['params'] / 1e9:g} B-parameter "
           f"bf16 model with 1 % of elements changed; median (min–max) of {d['repeats']} rounds{_load_note(d)}. The "
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


def _zero_sizes(settings: dict) -> str:
    """Which ZeRO bucket/live-parameter sizes a scaling run used (runs before they were keys: DeepSpeed's)."""
    if settings.get("zero_sizes", "deepspeed") == "deepspeed":
        return "DeepSpeed's default ZeRO buckets (5·10⁸ elements) and live parameters (10⁹)"
    z = settings["zero_optimization"]
    return (f"the trainer's ZeRO sizes ({z['reduce_bucket_size']:.0e}-element buckets, {z['stage3_max_live_parameters']:.0e} "
            f"live parameters, {z['sub_group_size']:.0e}-element sub-groups)").replace("e+0", "e")


def scaling() -> list[str]:
    d = _load("trainer_scaling")
    if not d:
        return []
    m, s = d["model"], d["settings"]
    out = [f"**Trainer scaling** — `python -m astraflow.benchmarks.trainer_scaling` (DeepSpeed on CPU, gloo, ranks "
           f"started by torch's launcher; random-init Qwen3 of {m['parameters'] / 1e6:.0f} M params, fp32 AdamW; the "
           f"same batch of {s['samples']} × {s['tokens_per_sample']} tokens; {s['threads_per_rank']} torch thread per "
           f"rank; {_zero_sizes(s)}; median (min–max) of {s['timed_steps']} steps after a dropped warm-up; 1-minute load average "
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
    m = d["modes"]
    out = [f"**Async vs sync vs one process** — `python -m astraflow.benchmarks.async_vs_sync` (the demo job, "
           f"{d['steps']} steps each; async and sync through `astraflow run` on one broker; in-process = the same "
           "prompts, seeds, model, batch and LR in one plain Python process (CPU engine + the project's "
           "DeepSpeedTrainer, no broker); s/step steady state after step 2; median (min–max) of "
           f"{d['repeats']} repetitions{_load_note(d)}. R and T are one batch's rollout and one train step, each "
           "measured alone in the in-process run; the system's own busy times are contended and not used as "
           "references)", "",
           "| mode | s/step | time to last step s | accuracy v0 → final |", "|---|---:|---:|---|"]
    labels = {"async": "async (1 RaaS node)", "sync": "sync", "inprocess": "in-process, 1 thread",
              "inprocess_all_cores": f"in-process, {m['inprocess_all_cores']['threads']} threads",
              "inprocess_overlapped": "in-process overlapped (async's schedule: rollout on a 2nd thread), "
                                      "1 thread per side"}
    for mode, label in labels.items():
        r = m[mode]
        out.append(f"| {label} | {_sp(r['s_per_step'])} | {_sp(r['time_to_last_step_s'], '.0f')} | "
                   f"{r['accuracy_initial']:.3f} → {_sp(r['accuracy_final'], '.3f')} |")
    out += ["", "| R alone s | T alone s | overlap efficiency max(R,T) / async s/step | sync efficiency (R+T) / sync "
            "s/step | async / in-process s/step | async speedup over sync |", "|---:|---:|---:|---:|---:|---:|",
            f"| {_sp(d['R_alone_s'], '.3f')} | {_sp(d['T_alone_s'], '.3f')} | {_sp(d['overlap_efficiency'])} | "
            f"{_sp(d['sync_efficiency'])} | {_sp(d['ratio_to_inprocess'])} | {_sp(d['speedup_async_over_sync'])}x |"]
    out += ["", "| overlap efficiency of the in-process overlapped loop (no plumbing) | async / in-process "
            "overlapped s/step |", "|---:|---:|",
            f"| {_sp(d['inprocess_overlap_efficiency'])} | {_sp(d['ratio_to_inprocess_overlapped'])} |"]
    return out + [""]


def delta_sparsity() -> list[str]:
    d = _load("delta_sparsity")
    if not d or d.get("quick"):
        return []
    out = [f"**Sparse-delta bytes against the learning rate** — `python -m astraflow.benchmarks.delta_sparsity` "
           f"(the demo job, async, bf16 deltas, {d['steps']} steps, the same seeds at every learning rate; median "
           f"(min–max) of {d['repeats']} repetitions{_load_note(d)})", "",
           "| lr | delta bytes / version | elements changed | delta / full snapshot | ≤ 1/20 | accuracy v0 → final |",
           "|---:|---:|---:|---:|---|---|"]
    for lr, r in sorted(d["by_lr"].items(), key=lambda kv: -float(kv[0])):
        out.append(f"| {lr} | {_sp(r['delta_bytes'], ',.0f')} | {_sp(r['delta_changed_frac'], '.3f')} | "
                   f"{_sp(r['delta_over_snapshot'], '.3f')} | {'yes' if r['meets_goal'] else 'no'} | "
                   f"{r['accuracy_initial']:.3f} → {_sp(r['accuracy_final'], '.3f')} |")
    return out + [""]


def publish_dtype() -> list[str]:
    d = _load("publish_dtype")
    if not d:
        return []
    out = [f"**Publishing fp32 vs bf16 to the fp32 CPU engine** — `python -m astraflow.benchmarks.publish_dtype` "
           f"(the demo job, {d['steps']} steps, the same seeds for both; s/step, bytes and accuracy from an async run, "
           "the train–inference log-prob gap — mean |logp_trainer − logp_behaviour| over tokens generated at the "
           "version the trainer held — from a sync run, where every step has such tokens; median (min–max) of "
           f"{d['repeats']} repetitions{_load_note(d)})", "",
           "| published | s/step | delta bytes / version | elements changed | publisher encode s | "
           "train–inference logp gap | accuracy v0 → final |", "|---|---:|---:|---:|---:|---:|---|"]
    for dtype in ("float32", "bfloat16"):
        r = d["dtypes"][dtype]
        gap = _sp(r["logp_gap"], ".1e") if r.get("logp_gap") else "–"
        out.append(f"| {dtype} | {_sp(r['s_per_step'])} | {_sp(r['delta_bytes'], ',.0f')} | "
                   f"{_sp(r['delta_changed_frac'], '.3f')} | {_sp(r['delta_encode_s'], '.3f')} | {gap} | "
                   f"{r['accuracy_initial']:.3f} → {_sp(r['accuracy_final'], '.3f')} |")
    ratio = d.get("bf16_over_fp32_logp_gap")
    out += ["", f"bf16 / fp32, paired by repetition: s/step {_sp(d['bf16_over_fp32_s_per_step'])}, bytes per "
                f"version {_sp(d['bf16_over_fp32_delta_bytes'])}"
                + (f", log-prob gap {_sp(ratio, ',.0f')}x" if ratio else "") + ".", ""]
    return out


def multi_policy() -> list[str]:
    d = _load("multi_policy")
    if not d:
        return []
    s, arms = d["s_per_iter"], d["arms"]
    out = [f"**Multi-policy** — `python -m astraflow.benchmarks.multi_policy` (solver–verifier, "
           f"{d['steps']} iterations per arm at equal samples per iteration, median (min–max) of {d['repeats']} "
           f"repetitions{_load_note(d)}; an iteration = every policy one step)", "",
           "| arm | s / iteration | held-out team accuracy (this run's, the verifier before its revision 2) |",
           "|---|---:|---:|"]
    names = {"async": "(a) async multi-policy (Kafka, no barrier)", "lockstep": "(b) `barrier: lockstep`",
             "sequential": "(c) sequential single controller, one process, no Kafka"}
    for key, label in names.items():
        team = arms.get(key, {}).get("team_accuracy")
        out.append(f"| {label} | {_sp(s[key])} | {_sp(team, '.3f') if team else '–'} |")
    out += [f"| (d) the solver alone, same wall-clock as (a) | – | solver alone: "
            f"{_sp(d['solver_alone_accuracy'], '.3f')} |", "",
            f"Speed-up of (a): {_sp(d['speedup_vs_sequential'])}x vs (c), {_sp(d['speedup_vs_lockstep'])}x vs (b); "
            f"team accuracy at version 0: {_sp(d['team_accuracy_initial'], '.3f')}. "
            + (f"A verifier call over Kafka (request on `generate.verifier`, served by the verifier's pool, "
               f"reply on `replies`) costs the episode {_sp(arms['async']['remote_wait_s_per_call'], '.3f')} s "
               f"in (a), against {_sp(arms['sequential']['G_verifier_s'], '.3f')} s per iteration for every "
               f"verifier row of (c) in one engine call. "
               if "remote_wait_s_per_call" in arms.get("async", {}) and "G_verifier_s" in arms["sequential"]
               else "")
            + " ".join(d.get("notes", [])[:1]), ""]
    sections = sorted(k for k in d if k == "team_vs_alone" or k.startswith("team_vs_alone_"))
    return out + [line for k in sections for line in team_vs_alone(d[k], k)]


def team_vs_alone(t: dict | None, section: str = "team_vs_alone") -> list[str]:
    """A ``team_vs_alone[_<workflow>]`` section of multi_policy.json: a team against its solver alone."""
    if not t:
        return []
    sets = " ".join(f"--set {k}={v}" for k, v in t.get("overrides", {}).items())
    config = "" if section == "team_vs_alone" else f"--config examples/{section.removeprefix('team_vs_alone_')}.yaml "
    live = "" if t.get("alone_eval", "live") == "live" else f"--alone-eval {t['alone_eval']} "
    who = "" if section == "team_vs_alone" else f" ({section.removeprefix('team_vs_alone_')})"
    out = [f"**The team against the solver alone{who}** — `python -m astraflow.benchmarks.multi_policy {config}"
           f"--arms async,alone --steps {t['steps']} --alone-eval-every {t['alone_eval_every']} {live}"
           f"--alone-run-factor {t['alone_run_factor']:g} {sets}` (`multi_policy.json`, section `{section}`; "
           f"held-out accuracy, median (min–max) of {t['repeats']} repetitions{_load_note(t)})", "",
           "| held-out accuracy | median (min–max) | team − alone | in SEs (binomial / problems only) | team ahead |",
           "|---|---:|---:|---:|---:|",
           f"| team, after {t['steps']} iterations | {_sp(t['team_accuracy'], '.3f')} | | | |"]
    rows = (("solver alone, equal generated tokens", "solver_alone_accuracy_equal_tokens", "equal_tokens"),
            ("solver alone, equal wall-clock", "solver_alone_accuracy", "equal_wall_clock"),
            ("solver alone, best version of a longer run", "solver_alone_accuracy_best_evaluated", "best_evaluated"))
    for label, key, diff in rows:
        if key not in t:
            continue
        m = t.get("team_minus_alone", {}).get(diff)
        tail = (f"{m['diff']:+.3f} ± {m['se']:.3f} | {m['in_se']:.1f} / {m['in_se_upper']:.1f} | "
                f"{m['repetitions_team_ahead']} of {m['repetitions']}" if m else "| |")
        out.append(f"| {label} | {_sp(t[key], '.3f')} | {tail} |")
    return out + [""]


def multi_policy_emulated() -> list[str]:
    d = _load("multi_policy_emulated")
    if not d:
        return []
    from astraflow.benchmarks.multi_policy_emulated import placement
    split = "; ".join(f"{p}: {placement(x)}" for p, x in d["device_split"]["split"].items())
    # the splits found after Table 2 (of this Table 2: a section of an older one is not shown)
    later = {k: d[k] for k in ("repriced", "tuned") if d.get(k) and d[k].get("table2_created") == d.get("created")}
    out = [f"**Multi-policy at the seed's scale, EMULATED** — `python -m astraflow.benchmarks.multi_policy --emulated` "
           f"(solver–verifier, {d['shape']['groups_per_batch']} prompts × {d['shape']['n_samples']} samples per batch, "
           f"{d['shape']['minibatches']} PPO minibatches; **{d['devices']} emulated {d['profile']} devices**: the tiny "
           f"model computes, each call is held for the cost model's time; **modelled seconds**, not GPU measurements; "
           f"{d['steps']} iterations per arm, median (min–max) of {d['repeats']} repetitions; "
           f"{_lengths(d)}; split of (a)/(b) chosen by the benchmark's rule: {split})", "",
           "| arm (emulated) | modelled s / iteration | lower bound s / iteration | scheduling efficiency | "
           "speed-up vs (c) | max CPU share of a hold |",
           "|---|---:|---:|---:|---:|---:|"]
    labels = {"async": "(a) ours: disjoint devices, async", "lockstep": "(b) the same, `barrier: lockstep`",
              "colocated": "(c) trainer-centred: one controller, all devices colocated"}
    for arm, label in labels.items():
        r = d["arms"][arm]
        vs = _sp(r["speedup_vs_sequential"]) + "x" if "speedup_vs_sequential" in r else "1"
        out.append(f"| {label} | {_sp(r['s_per_iter'], '.1f')} | {_sp(r['lower_bound_s_per_iter'], '.1f')} | "
                   f"{_sp(r['scheduling_efficiency'])} | {vs} | {_sp(r['max_cpu_fraction'])} |")
    how = {"repriced": ("re-priced", "--reprice"), "tuned": ("tuned", "--tune")}
    for key, sec in later.items():
        for arm, r in (sec.get("arms") or {}).items():
            tag = {"async": "(a)", "lockstep": "(b)"}[arm]
            out.append(f"| {tag} on the {how[key][0]} split (`{how[key][1]}`, {r['s_per_iter']['n']} repetitions) | "
                       f"{_sp(r['s_per_iter'], '.1f')} | {_sp(r['lower_bound_s_per_iter'], '.1f')} | "
                       f"{_sp(r['scheduling_efficiency'])} | {_sp(r['speedup_vs_sequential'])}x | "
                       f"{_sp(r['max_cpu_fraction'])} |")
    out += ["", f"(a) vs (b): {_sp(d['speedup_vs_lockstep'])}x. The seed reports 2.74x on real 8 × H100 "
                "(212.64 → 77.65 s/iter). " + " ".join(d["notes"][2:]), ""]
    for key, sec in later.items():
        out += [_later_split(key, sec, placement), ""]
    return out


def _later_split(key: str, sec: dict, placement) -> str:
    """One line on a split found after Table 2: how, what it measured, how it pairs."""
    parts = "; ".join(f"{p}: {placement(x)}" for p, x in sec["split"]["split"].items())
    if key == "repriced":
        line = (f"Re-priced on (a)'s own steady windows (`--reprice`): {parts}, priced bound "
                f"{sec['split']['priced_bound_s_per_iter']:.1f} s/iter")
    else:
        probes = "; ".join(f"{p['from']} → {p['to']}: (a) {p['s_per_iter']:.1f} s/iter against "
                           f"{p['against_s_per_iter']:.1f}, {'kept' if p['accepted'] else 'not kept'}"
                           for p in sec.get("probes", []))
        line = (f"Tuned by measuring (a) (`--tune`: a device to the busiest stage of the steady window from the least "
                f"busy that can spare one, one run per probe, kept when ≥ 5 % faster; probes: {probes or 'none'}): "
                f"{parts}")
    if sec.get("same_as_table2"):
        return line + " — the rule's split again, so nothing more to measure."
    a = (sec.get("arms") or {}).get("async") or {}
    return line + (" — measured in its own invocation, each repetition paired with Table 2's (c) repetition of the "
                   "same index (same settings, seeds and config)"
                   + (f"; (a) vs (b) there {_sp(a['speedup_vs_lockstep'])}x" if "speedup_vs_lockstep" in a else "")
                   + (f"; vs Table 2's (a) {_sp(a['speedup_vs_table2_async'])}x" if a.get("speedup_vs_table2_async")
                      else "") + ".")


def _lengths(d: dict) -> str:
    """How a Table 2 result priced its lengths (results before the workload option had none)."""
    cap = d.get("max_new_tokens_modelled")
    cap_s = f"length cap {cap} modelled tokens" if cap else f"token_scale {d.get('token_scale')}"
    if d.get("workload"):
        return f"{cap_s}, lengths spread by the `{d['workload']}` workload (emulation/profiles.yaml)"
    return f"{cap_s}, the tiny model's lengths scaled"


def async_sync_emulated() -> list[str]:
    d = (_load("async_vs_sync") or {}).get("emulated")
    if not d:
        return []
    m = d["modes"]
    out = [f"**Async vs sync, EMULATED** — `python -m astraflow.benchmarks.async_vs_sync --emulated` (the demo job, "
           f"{d['steps']} steps; RaaS node on {d['rollout_devices']} and trainer on {d['trainer_devices']} emulated "
           f"{d['profile']} devices; **modelled seconds**; R and T from each run's own emulated accounts; median "
           f"(min–max) of {d['repeats']} repetitions)", "",
           "| mode (emulated) | modelled s/step | R s | T s |", "|---|---:|---:|---:|"]
    for mode in ("async", "sync"):
        r = m[mode]
        out.append(f"| {mode} | {_sp(r['s_per_step'], '.1f')} | {_sp(r['R_s'], '.1f')} | {_sp(r['T_s'], '.1f')} |")
    out += ["", f"Overlap efficiency max(R,T) / async s/step {_sp(d['overlap_efficiency'])}; sync efficiency "
                f"{_sp(d['sync_efficiency'])}; async speed-up over sync {_sp(d['speedup_async_over_sync'])}x against "
                f"the cost model's ideal {_sp(d['ideal_speedup_async_over_sync'])}x.", ""]
    return out


def elastic_emulated() -> list[str]:
    d = (_load("elastic") or {}).get("emulated")
    if not d or d.get("quick"):
        return []
    pr = d["pricing"]
    out = [f"**Elastic RaaS pools, EMULATED** — `python -m astraflow.benchmarks.elastic --emulated` (the demo job, "
           f"{d['job_shape']['groups_per_batch']} prompts × {d['job_shape']['n_samples']} samples per step, "
           f"{d['steps']} steps per arm, through `astraflow launch`; trainer on {pr['trainer_devices']} and each "
           f"RaaS node on 1 emulated {d['profile']} device; pool sizes from the cost model's balance point N* = "
           f"{pr['balance_nodes']:.2f} nodes: small {pr['small']}, large {pr['large']}; **modelled device-hours** "
           f"(heartbeat wall hours / dilation {d['dilation']}), not GPU measurements; "
           + (f"the median repetition of {d['repeats']}, arms interleaved" if d.get("repeats", 1) > 1 else "one run")
           + f"{_load_note(d)})", "",
           "| arm (emulated) | modelled s | trainer wait | pool mean/max | rollout dev-h | trainer dev-h | "
           "total dev-h (modelled) | held-out acc | overruns |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for arm in ("fixed_small", "fixed_large", "autoscaling"):
        if arm not in d:
            continue
        r = d[arm]
        acc = f"{r['accuracy']:.3f}" if r.get("accuracy") is not None else "–"
        out.append(f"| {arm} | {r['modelled_s']:.0f} | {r['trainer_wait_frac'] or 0:.2f} | "
                   f"{r['pool_mean'] or 0:.1f} / {r['pool_max'] or 0:.0f} | {r['rollout_device_hours']:.3f} | "
                   f"{r['trainer_device_hours']:.3f} | "
                   + (_sp(r["total_device_hours_spread"], ".3f") if "total_device_hours_spread" in r
                      else f"{r['total_device_hours']:.3f}")
                   + f" | {acc} | {r.get('overruns_total', r['instrument']['overruns'])} |")
    if "verdict" in d and not d["verdict"].get("valid", True):
        out += ["", "No verdict: an arm stopped short of its steps or failed its conservation audit."]
    elif "verdict" in d:
        v = d["verdict"]
        pct = lambda k: (f"{v[k]:+.1%}" + (f" ({v[k + '_spread']['min']:+.1%} to {v[k + '_spread']['max']:+.1%})"  # noqa: E731
                                             if k + "_spread" in v else ""))
        out += ["", f"Autoscaling vs fixed_small {pct('autoscaling_vs_fixed_small')}, vs fixed_large "
                    f"{pct('autoscaling_vs_fixed_large')} modelled device-hours"
                    + (", paired repetition by repetition" if "autoscaling_vs_fixed_small_spread" in v else "")
                    + " (the seed, Qwen3-14B on real GPUs: −13 %)."]
    return out + [""]


def emulated_scale() -> list[str]:
    d = _load("emulated_scale")
    if not d or d.get("quick"):
        return []
    out = [f"**Scale, EMULATED** — `python -m astraflow.benchmarks.emulated_scale` (the demo job, async, on N emulated "
           f"{d['profile']} devices: half rollout on RaaS nodes of up to 8, half training; the batch grows with N; "
           f"{d['steps']} steps; **modelled seconds**; median (min–max) of {d['repeats']} repetitions)", "",
           *_scale_rows(d["by_devices"], "step")]
    return out + [""] + emulated_scale_team(d.get("solver_verifier"))


def _scale_rows(by_devices: dict, per: str) -> list[str]:
    """The table of a weak-scaling run: one row per device count, times per ``per`` (step, iter)."""
    out = [f"| devices (emulated) | samples/s | s/{per} | lower bound s/{per} | scheduling efficiency | linearity vs 8 |",
           "|---:|---:|---:|---:|---:|---:|"]
    for n, r in by_devices.items():
        out.append(f"| {n} | {_sp(r['samples_per_s'], '.1f')} | {_sp(r[f's_per_{per}'], '.1f')} | "
                   f"{_sp(r[f'lower_bound_s_per_{per}'], '.1f')} | {_sp(r['scheduling_efficiency'])} | "
                   f"{_sp(r['linearity'])} |")
    return out


def emulated_scale_team(sv: dict | None) -> list[str]:
    """The solver-verifier team's rows of ``emulated_scale --job solver_verifier``."""
    if not sv or not sv.get("by_devices"):
        return []
    reps = ", ".join(f"{n}: {r['s_per_iter']['n']}" for n, r in sv["by_devices"].items())
    load = _load_note(sv)
    out = [f"**The solver–verifier team at scale, EMULATED** — `python -m astraflow.benchmarks.emulated_scale --job "
           f"solver_verifier` (Table 2's arm (a) at N devices, the batch grown with N; {sv['steps']} "
           f"iterations; **modelled seconds**; median (min–max) of each row's repetitions ({reps})"
           f"{load and load + ' (the last run)'})", "",
           *_scale_rows(sv["by_devices"], "iter")]
    splits = []
    for n, lay in sv.get("layouts", {}).items():
        parts = ", ".join(f"{p} {d['rollout']}+{d['trainer']}" for p, d in lay["split"].items())
        rule = lay.get("split_rule", "scaled")
        what = "Table 2 x N/8" if rule == "scaled" else "balanced at N"
        measured = sv["by_devices"].get(n, {}).get("lower_bound_s_per_iter", {}).get("median")
        if rule == "balanced" and "priced_bound_s_per_iter" in lay and measured is not None:
            what += f"; priced bound {lay['priced_bound_s_per_iter']:.1f} s/iter, measured {measured:.1f}"
        splits.append(f"{n}: {parts} ({what})")
    if splits:
        out += ["", "Devices (rollout + trainer per policy): " + "; ".join(splits) + ". Balanced: re-chosen at N to "
                "minimise the largest stage, priced on the 8-device run (`--split balanced`)."]
    return out + [""]


def multi_turn() -> list[str]:
    d = _load("multi_turn")
    if not d or d.get("quick"):
        return []
    st = d["setup"]
    out = [f"**Multi-turn episodes with tool waits** — `python -m astraflow.benchmarks.multi_turn` (one RaaS "
           f"node's poll on the CPU engine: {st['episodes']} agent episodes x {st['samples']} samples, {st['turns']} "
           f"turns, every step a tool call of {st['tool_s']} s x [0.5, 1.5); the same episodes and tokens in both arms; "
           f"median (min–max) of {st['repeats']} repetitions{_load_note(d)})", "",
           "| tool latency | arm | s / poll | episodes/s | tokens/s | engine calls | rows / call |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for name, sc in d["scenarios"].items():
        label = "uniform" if not sc["slow_share"] else f"{sc['slow_share']:.0%} of calls x{sc['slow_factor']:g}"
        for arm, r in sc["arms"].items():
            out.append(f"| {label} | {arm} | {_sp(r['wall_s'])} | {_sp(r['episodes_per_s'])} | "
                       f"{_sp(r['tokens_per_s'], '.1f')} | {_sp(r['engine_calls'], '.0f')} | "
                       f"{_sp(r['rows_per_call'], '.1f')} |")
    out += ["", "Step-out speedup (stay_in s / step_out s): " + "; ".join(
        f"{name} {_sp(sc['step_out_speedup'])}" for name, sc in d["scenarios"].items()) + ". Re-prefill on the CPU "
        "engine (no prefix cache; a 6-token turn of 16 rows): " + ", ".join(
        f"context {k}: {v['median']:.3f} s ({v['reprefill_share']:.0%} re-prefill)" for k, v in d["reprefill"].items())
        + ".", ""]
    return out


def cross_region() -> list[str]:
    return _cross_region("cross_region") + _cross_region("cross_region_10mbit") + _cross_region("cross_region_lr5e-6")


def _cross_region(name: str) -> list[str]:
    d = _load(name)
    if not d:
        return []
    st = d["settings"]
    mbps, lr = d["settings"]["link"]["bandwidth_mbps"], st.get("lr")
    flag = ("" if mbps == 100 else f" --bandwidth-mbps {mbps:g}") + ("" if lr is None else f" --lr {lr:g}")
    flag += f" --out benchmarks/results/{name}.json" if flag else ""
    out = [f"**Cross-region{'' if mbps == 100 else f', a {mbps:g} Mbit/s link'}"
           f"{'' if lr is None else f', learning rate {lr:g}'}** — "
           f"`python -m astraflow.benchmarks.cross_region{flag}` (the demo job, "
           f"{st['steps']} steps, bf16 weights; trainer, dataflow and 1 RaaS node in region A, 2 RaaS nodes in B; "
           f"an emulated link of {st['link']['bandwidth_mbps']:g} Mbit/s and {st['link']['latency_ms_each_way']:g} ms "
           "each way (`tc tbf` shared by every connection + Toxiproxy); mirrored: B's own cluster filled by "
           "MirrorMaker 2, direct: B's nodes read A's cluster over the link; delta: a snapshot every "
           f"{st['delta_snapshot_every']} versions, full: a snapshot every version and no deltas; {st['repeats']} "
           f"run{'s' if st['repeats'] > 1 else ''} per arm"
           f"{_load_note(d)}. Bytes are those the link carried toward B per version published, tasks included; "
           "crossings = those bytes / the weight bytes published; lag = newest published version − the version a B "
           "node generated with, at each of its rollout calls; accuracy at the last version ± its standard error, "
           f"{st['eval_problems']} problems × {st['eval_k']})", "",
           "| arm | link bytes / version | crossings | lag p50 | lag p95 | s / step | accuracy | audit |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    def cell(c: dict, key: str, spec: str) -> str:
        """The median over the repetitions, and their range when there are several."""
        lo_hi = c.get(key + "_range")
        text = format(c[key], spec)
        return text if not lo_hi or lo_hi[0] == lo_hi[1] else \
            f"{text} ({format(lo_hi[0], spec)}–{format(lo_hi[1], spec)})"

    for m in ("mirrored", "direct"):
        for t in ("delta", "full"):
            c = d[m][t]
            out.append(f"| {m}, {t} | {cell(c, 'link_bytes_per_version', ',.0f')} | "
                       f"{cell(c, 'weights_crossings', '.2f')} | {cell(c, 'lag_versions_median', 'g')} | "
                       f"{cell(c, 'lag_versions_p95', 'g')} | {cell(c, 's_per_step', '.2f')} | "
                       f"{cell(c, 'accuracy', '.3f')} ± {c['accuracy_se']:.3f} | {'ok' if c['audit_ok'] else 'FAIL'} |")
    s = d["single_region"]
    out.append(f"| single region (3 nodes in A) | – | – | – | – | {cell(s, 's_per_step', '.2f')} | "
               f"{cell(s, 'accuracy', '.3f')} ± {s['accuracy_se']:.3f} | {'ok' if s['audit_ok'] else 'FAIL'} |")
    v = d["verdict"]
    out += ["", f"Mirrored delta bytes per version: {v['mirrored_delta_link_bytes_over_full_snapshot']:.3f} of a full "
                f"bf16 snapshot (goal ≤ 1/20: {'met' if v['goal_delta_le_1_20_of_snapshot'] else 'not met'}); "
                f"region-B lag p95 ≤ 2 versions: {'met' if v['goal_region_b_lag_p95_le_2'] else 'not met'}; accuracy "
                f"within 2 SE of single-region: {'met' if v['goal_accuracy_within_2_se_of_single_region'] else 'not met'}. "
                + (f"Of the mirrored delta bytes, a delta's own payload is {v['mirrored_delta_payload_over_full_snapshot']:.3f} "
                   f"of a snapshot ({v['bf16_elements_changed_per_version']:.1%} of bf16 elements changed per version, "
                   f"median) and the periodic snapshots {v['mirrored_snapshots_per_version_over_full_snapshot']:.3f}. "
                   if v.get("mirrored_delta_payload_over_full_snapshot") is not None else "")
                + f"Scaling: {st['scaling']}.", ""]
    return out


def _load_note(d: dict) -> str:
    if d.get("load_earlier_runs"):  # measured in several sittings: the range of their loads
        loads = [x["load"] for x in d["load_earlier_runs"] if x.get("load")] + [d.get("load") or {}]
        ones = [v[0] for x in loads for v in ((x.get("before") or {}).get("loadavg"),
                                                (x.get("after") or {}).get("loadavg")) if v]
        if ones:
            return (f"; measured in {len(loads)} sittings, 1-minute load average {min(ones):.1f}–{max(ones):.1f} "
                    f"on {d['machine']['cpus']} cores")
    if "load_1m_at_run_start" in d:
        x = d["load_1m_at_run_start"]
        return f"; 1-minute load average {x['min']:.1f}–{x['max']:.1f} at the runs' starts on {d['machine']['cpus']} cores"
    load = d.get("load") or {}
    before, after = (load.get("before") or {}).get("loadavg"), (load.get("after") or {}).get("loadavg")
    if not before or not after:
        return ""
    return f"; 1-minute load average {before[0]:.1f} → {after[0]:.1f} on {d['machine']['cpus']} cores"


def demo() -> list[str]:
    d = _load("demo_run")
    if not d:
        return []
    acc = " → ".join(f"v{v}: {a:.3f}" for v, a in d["accuracy_by_version"].items())
    return [f"**Demo** — `make demo` ({d['steps_trained']} versions in {d['wall_s']:.0f} s wall, "
            f"{d['samples_trained']:,} samples trained, async, 1 RaaS node): held-out pass@1 "
            f"(200 problems × 4 samples, T=0.6) {acc}{_gap(d)}", "",
            "![demo run](../benchmarks/results/demo_plot.png)", ""]


def _gap(d: dict) -> str:
    if d.get("train_inference_logp_gap") is None:
        return ""
    return (f". Training–inference log-prob gap (mean |logp_trainer − logp_behaviour| over tokens generated at "
            f"the trained version, {d['train_inference_logp_gap_steps']} steps): "
            f"{d['train_inference_logp_gap']:.1e} (max {d['train_inference_logp_gap_max']:.1e})")


def render() -> str:
    return "\n".join(demo() + async_sync() + async_sync_emulated() + publish_dtype() + delta_sparsity() + multi_policy()
                     + multi_policy_emulated() + emulated_scale() + elastic_emulated() + multi_turn() + cross_region()
                     + topics() + weights() + engine()
                     + scaling()).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update-docs", "--update-readme", dest="update_docs", action="store_true",
                    help="rewrite the results section of docs/benchmarks.md")
    args = ap.parse_args()
    text = render()
    if not args.update_docs:
        print(text)
        return 0
    page = ROOT / "docs" / "benchmarks.md"
    s = page.read_text()
    i, j = s.index(START) + len(START), s.index(END)
    page.write_text(s[:i] + "\n" + text + s[j:])
    print(f"updated {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
