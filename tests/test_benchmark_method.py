"""The benchmarks' method: repeated numbers carry their spread and load, and each
comparison measures equal work on both sides (same rows, same token counts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from astraflow.benchmarks import engine_throughput
from astraflow.benchmarks.lib import results, stats


def test_spread_keeps_median_min_max_and_every_run():
    s = stats.spread([3.0, 1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 10.0, 4)
    assert s["runs"] == [3.0, 1.0, 2.0, 10.0]
    r = stats.ratio_spread(stats.spread([2, 4, 6]), stats.spread([1, 2, 2]))
    assert r["runs"] == [2.0, 2.0, 3.0] and r["median"] == 2.0
    with pytest.raises(ValueError, match="at least one"):
        stats.spread([])
    with pytest.raises(ValueError, match="paired runs"):
        stats.ratio_spread(stats.spread([1, 2]), stats.spread([1]))


def test_results_record_the_load_they_were_measured_under(tmp_path):
    before = results.load_now()
    results.write_results(tmp_path / "x.json", {"a": 1}, before)
    data = json.loads((tmp_path / "x.json").read_text())
    assert data["load"]["before"] == before
    assert len(data["load"]["after"]["loadavg"]) == 3 and isinstance(data["load"]["busy"], bool)



def test_a_section_is_written_beside_the_files_other_sections_and_records_its_own_load(tmp_path):
    """An emulated benchmark writes its section of a results file the CPU arms share."""
    path = tmp_path / "x.json"
    results.write_results(path, {"benchmark": "x", "cpu_arm": 1}, results.load_now())
    before = results.load_now()
    results.write_section(path, "emulated", {"arm": 2}, before, "x")
    data = json.loads(path.read_text())
    assert data["cpu_arm"] == 1 and data["emulated"]["arm"] == 2
    assert data["emulated"]["load"]["before"] == before and "created" in data["emulated"]
    fresh = tmp_path / "y.json"
    results.write_section(fresh, "emulated", {"arm": 3}, None, "y")
    assert json.loads(fresh.read_text())["benchmark"] == "y"


@pytest.fixture(scope="module")
def tiny_lm():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from astraflow.models.bootstrap import ensure_tiny_model
    path = ensure_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return path, model, AutoTokenizer.from_pretrained(str(path))


def test_hf_side_generates_exactly_the_engines_row_lengths(tiny_lm):
    """The engine rows' lengths drive HF generate, so both sides count the same tokens."""
    from astraflow.engines.base import SamplingParams
    from astraflow.engines.cpu import CpuEngine

    path, model, tok = tiny_lm
    model.generation_config.eos_token_id = None
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("12+7=", "3+4=", "55+21=", "9+9=")]
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=(tok.eos_token_id,), seed=7)
    lengths = [len(g.tokens) for g in CpuEngine(path).generate(prompts, params)]
    forced = [1, 5, 12, 3]
    assert engine_throughput.naive_generate(model, prompts, params, tok.pad_token_id, forced) == sum(forced)
    assert engine_throughput.naive_generate(model, prompts, params, tok.pad_token_id, lengths) == sum(lengths)


def test_compare_refuses_unequal_work():
    with pytest.raises(RuntimeError, match="different token counts"):
        engine_throughput.compare(lambda: 10, lambda: 11, repeats=3)
    out = engine_throughput.compare(lambda: 10, lambda: 10, repeats=3)
    assert out["tokens"] == 10 and out["speedup"]["n"] == 3 and "cold" in out


def test_entropy_estimate_counts_mask_and_value_bytes():
    """The delta's reference line: log2 C(n, k) for the mask, byte-plane entropy for values."""
    import math

    import numpy as np

    from astraflow.benchmarks import codec_throughput as ct
    from astraflow.weights.format import tensor_bits

    n = 1 << 16
    base = {"w": torch.zeros(n, dtype=torch.bfloat16)}
    same_value = {"w": base["w"].clone()}
    same_value["w"][:100] = 1.0  # k = 100 changes, all to the same bits: no value entropy
    est = ct.entropy_estimate(base, same_value)
    mask = (math.lgamma(n + 1) - math.lgamma(101) - math.lgamma(n - 99)) / math.log(2) / 8
    assert est["changed"] == 100 and est["values_bytes"] == 0
    assert est["mask_bytes"] == math.ceil(mask)
    noisy = {"w": base["w"].clone()}
    rng = np.random.default_rng(0)
    tensor_bits(noisy["w"])[:] = rng.integers(1, 1 << 16, size=n, dtype=np.uint16)  # every element, random bits
    est = ct.entropy_estimate(base, noisy)
    assert est["mask_bytes"] == 0 and 0.98 * 2 * n <= est["values_bytes"] <= 2 * n
    assert ct.entropy_estimate(None, noisy)["bytes"] == est["values_bytes"]  # a snapshot: no mask


def test_delta_codec_pairs_each_round_with_a_memcpy_of_the_same_threads():
    from astraflow.benchmarks import codec_throughput as ct

    base = ct.make_model(200_000, 4, seed=0)
    new = ct.make_step(base, 0.01, "random", seed=1)
    r = ct.delta_codec(base, new, threads=2, repeats=3)
    assert r["threads"] == 2 and r["memcpy_gbps"]["n"] == 3 and "cold" in r
    for codec, ratio in (("delta_encode_gbps", "encode_vs_memcpy"), ("delta_apply_gbps", "decode_vs_memcpy")):
        assert r[ratio]["runs"] == pytest.approx([c / m for c, m in zip(r[codec]["runs"], r["memcpy_gbps"]["runs"])])
    assert 0.9 < r["delta_over_entropy_estimate"] < 1.5
    assert ct.Memcpy(base, 2).gbps() > 0


def test_weight_transfer_reports_snapshot_e2e_and_the_kafka_tool_on_the_same_records(bootstrap):
    from astraflow.benchmarks import codec_throughput as ct
    from astraflow.benchmarks import weight_transfer as wt

    base = ct.make_model(100_000, 2, seed=0)
    lat = wt.transfer_latency(bootstrap, "t", lambda v: base if v == 0 else ct.make_step(base, 0.01, "random", v),
                              2, subscribers=1, threads=1, repeats=2, with_tools=True)
    assert lat["snapshot_e2e_MBps"]["runs"] == pytest.approx([lat["full_bytes"] / s / 1e6 for s in lat["full_s"]["runs"]])
    assert lat["weights_records"] >= 2 and lat["weights_topic_bytes"] > lat["full_bytes"]
    tool = wt.kafka_tool_consume(bootstrap, lat, repeats=1)
    assert tool["records"] == lat["weights_records"] and tool["MBps"]["median"] > 0
    # The tools ran after each round: every ratio pairs one round's snapshot with that round's tools.
    tools = lat["tools"]
    snap, cons, prod = (x["runs"] for x in (lat["snapshot_e2e_MBps"], tools["consume"]["MBps"], tools["produce"]["MBps"]))
    assert len(snap) == len(cons) == len(prod) == 2 and min(cons + prod) > 0
    assert tools["snapshot_vs_consume"]["runs"] == pytest.approx([s / c for s, c in zip(snap, cons)])
    series = [1 / (1 / p + 1 / c) for p, c in zip(prod, cons)]
    assert tools["snapshot_vs_in_series"]["runs"] == pytest.approx([s / x for s, x in zip(snap, series)])


def test_topics_plain_kafka_python_row_moves_the_same_bytes_as_ours(bootstrap):
    import uuid

    from astraflow.benchmarks import topics_throughput as tt
    from astraflow.topics import TopicSpec, ensure_topics
    from astraflow.topics.codec import encode

    ours_t, plain_t = (f"af.b{uuid.uuid4().hex[:6]}.{k}" for k in ("ours", "plain"))
    ensure_topics(bootstrap, [TopicSpec(t, partitions=1) for t in (ours_t, plain_t)])
    msgs = [tt.trajectory(i) for i in range(20)]
    value_bytes = sum(len(encode(m)[0]) for m in msgs) / len(msgs)
    op, oc = tt.ours_typed(bootstrap, ours_t, msgs, 40, value_bytes)
    pp = tt.plain_produce(bootstrap, plain_t, [encode(m, "bench") for m in msgs], 40, compression_type="zstd",
                          linger_ms=5)
    pc = tt.plain_consume(bootstrap, plain_t, 40)
    sc = tt.stock_consume(bootstrap, plain_t, 40)
    from astraflow.topics import socket_reads
    assert socket_reads.installed()  # stock_consume puts the larger reads back
    assert op["records"] == oc["records"] == pp["records"] == pc["records"] == sc["records"] == 40
    assert pp["bytes"] == pc["bytes"] == sc["bytes"] == pytest.approx(op["bytes"])
    rounds = [[("w", "consume", c, m) for c, m in (("ours", oc), ("kafka-python", pc), ("kafka tool", pc),
                                                   ("kafka-python stock reads", sc))]] * 3
    row, = tt.summarise(rounds)
    assert row["ours_over_plain"]["median"] == pytest.approx(pc["seconds"] / oc["seconds"])
    assert row["plain_over_stock"]["median"] == pytest.approx(sc["seconds"] / pc["seconds"])
    assert row["plain_MB_per_s"]["n"] == 3
    assert oc["cpu_seconds"] >= 0 and pc["cpu_seconds"] >= 0  # each consuming thread's own CPU
    # records per CPU second, ours over kafka-python's: 40 records in 0.002 s against 0.001 s
    cpu, = tt.summarise([[("w", "consume", c, dict(m, cpu_seconds=x)) for c, m, x in (
        ("ours", oc, 0.002), ("kafka-python", pc, 0.001), ("kafka tool", pc, 0.001))]] * 3)
    assert cpu["ours_cpu_us_per_record"]["median"] == pytest.approx(50.0)
    assert cpu["ours_over_plain_cpu"]["median"] == pytest.approx(0.5)
    produce, = tt.summarise([[("w", "produce", c, m) for c, m in (("ours", op), ("kafka-python", pp),
                                                                  ("kafka tool", pp))]] * 3)
    assert "stock_MB_per_s" not in produce and "plain_over_stock" not in produce
    assert "ours_over_plain_cpu" not in produce  # producers' CPU is not measured


def test_async_vs_sync_measures_every_mode_against_r_and_t_alone():
    """One reference for all modes: R and T from the in-process run, not each mode's own."""
    from astraflow.benchmarks import async_vs_sync

    def system(s_per_step, acc):
        return {"s_per_step": s_per_step, "rollout_busy_frac": 0.5, "trainer_busy_frac": 0.5, "R_in_run_s": 9.0,
                "T_in_run_s": 9.0, "time_to_first_step_s": 10.0, "time_to_last_step_s": 30.0,
                "accuracy_initial": 0.1, "accuracy_final": acc, "load_before": [1.0, 1.0, 1.0],
                "critical_path": {"publish_s": 0.1, "schedule_s": 0.02, "to_rollout_s": 0.05, "rollout_s": s_per_step / 2,
                                  "batch_s": 0.03, "pickup_s": 0.1, "path_s": 0.2 + s_per_step / 2, "batches": 30}}

    def inproc(R, T, W, threads):
        return {"s_per_step": R + T + W, "R_s": R, "T_s": T, "W_s": W, "setup_s": 5.0, "time_to_last_step_s": 20.0,
                "accuracy_initial": 0.1, "accuracy_final": 0.2, "threads": threads, "load_before": [2.0, 1.0, 1.0]}

    reps = [{"async": system(0.5, 0.2), "sync": system(0.8, 0.2), "inprocess": inproc(0.2, 0.4, 0.0, 1),
             "inprocess_all_cores": inproc(0.1, 0.3, 0.0, 2),
             "inprocess_overlapped": {**inproc(0.2, 0.4, 0.0, 1), "s_per_step": 0.42},
             "inprocess_time_to_async_accuracy_s": 12.0}
            for _ in range(3)]
    agg = async_vs_sync.aggregate(reps)
    # the overlapped loop is judged by the same R and T alone, and async against it
    assert agg["inprocess_overlap_efficiency"]["median"] == pytest.approx(0.4 / 0.42)
    assert agg["ratio_to_inprocess_overlapped"]["median"] == pytest.approx(0.5 / 0.42)
    assert agg["overlap_efficiency"]["median"] == pytest.approx(0.4 / 0.5)
    assert agg["sync_efficiency"]["median"] == pytest.approx(0.6 / 0.8)
    assert agg["ratio_to_inprocess"]["median"] == pytest.approx(0.5 / 0.6)
    assert agg["inprocess_s_per_step"]["median"] == pytest.approx(0.6)
    assert agg["speedup_async_over_sync"]["median"] == pytest.approx(0.8 / 0.5)
    assert agg["ratio_to_inprocess_all_cores"]["median"] == pytest.approx(0.5 / 0.4)
    assert agg["inprocess_thread_scaling"]["median"] == pytest.approx(0.6 / 0.4)  # 1 thread over every core
    assert agg["modes"]["inprocess_all_cores"]["threads"] == 2 and agg["R_alone_s"]["n"] == 3
    assert (agg["load_1m_at_run_start"]["min"], agg["load_1m_at_run_start"]["max"]) == (1.0, 2.0)
    path = agg["modes"]["async"]["critical_path"]
    assert path["rollout_s"]["median"] == pytest.approx(0.25) and path["path_s"]["n"] == 3
    assert "batches" not in path  # a count, not a stage


def test_publish_dtype_pairs_the_dtypes_by_repetition_and_takes_the_gap_from_the_sync_run():
    from astraflow.benchmarks import publish_dtype

    def run(s_per_step, nbytes, gap):
        return {"s_per_step": s_per_step, "delta_bytes": nbytes, "delta_changed_frac": 0.5, "delta_encode_s": 0.1,
                "snapshot_bytes": 1e6, "accuracy_final": 0.2, "accuracy_initial": 0.1, "time_to_first_step_s": 9.0,
                "logp_gap": gap, "logp_gap_steps": 10, "load_before": [1.0 + s_per_step, 1.0, 1.0]}

    reps = [{"float32": run(0.6 + i / 10, 8e6, 1e-7), "bfloat16": run(0.3 + i / 10, 2e6, 1e-3)} for i in range(3)]
    agg = publish_dtype.aggregate(reps)
    assert agg["bf16_over_fp32_s_per_step"]["runs"] == pytest.approx([0.3 / 0.6, 0.4 / 0.7, 0.5 / 0.8])
    assert agg["bf16_over_fp32_delta_bytes"]["median"] == pytest.approx(0.25)
    assert agg["bf16_over_fp32_logp_gap"]["median"] == pytest.approx(1e4)
    reps[1]["bfloat16"]["logp_gap"] = None  # a run without a comparable token: no paired ratio
    assert publish_dtype.aggregate(reps)["bf16_over_fp32_logp_gap"] is None


def test_broker_jit_counts_each_component_inside_the_window_and_pairs_the_arms():
    from astraflow.benchmarks import broker_jit

    assert broker_jit.component(["java", "-Xmx1g", "-cp", "x", "kafka.Kafka", "p"], root=False) == "broker"
    assert broker_jit.component(["python", "-m", "astraflow", "node", "--role", "raas"], root=False) == "raas"
    assert broker_jit.component(["python", "-c", "x"], root=False) is None
    sampler = broker_jit.CpuSampler.__new__(broker_jit.CpuSampler)  # its samples, without a process to watch
    sampler.samples = [(10.0, {"broker": 5.0, "trainer": 1.0}), (11.0, {"broker": 6.0, "trainer": 2.0}),
                       (13.0, {"broker": 6.5, "trainer": 4.0, "raas": 1.0})]
    # from the last sample at or before the window's start to the last one at or before its end
    assert broker_jit.window_cpu(sampler, 10.5, 13.2, 2) == {"broker": 0.75, "trainer": 1.5, "raas": 0.5}
    assert broker_jit.window_cpu(sampler, 9.0, 10.9, 1) == {"broker": 0.0, "trainer": 0.0}

    def run(x):
        return {"wall_s": 100 * x, "s_per_step": x, "cpu_per_step": 2 * x, "broker_cpu_per_step": x / 4,
                "broker_cpu_run_s": 30 * x, "load_before": [x, 1.0, 1.0]}

    reps = [{"c1": run(0.4 + i / 10), "tiered": run(0.5 + i / 10)} for i in range(3)]
    agg = broker_jit.aggregate(reps)
    assert agg["c1_over_tiered"]["s_per_step"]["runs"] == pytest.approx([0.4 / 0.5, 0.5 / 0.6, 0.6 / 0.7])
    assert agg["arms"]["tiered"]["broker_cpu_run_s"]["median"] == pytest.approx(18.0)
    assert agg["load_1m_at_run_start"]["n"] == 6


def test_broker_jit_knows_a_child_once_it_has_exec_d():
    """A child seen between fork and exec still carries its parent's argv: the sampler asks again
    until it is what it runs (one broker went uncounted when the first answer was kept)."""
    from astraflow.benchmarks import broker_jit

    child = "sleep 0.6; exec " + sys.executable + " -c 'import time; time.sleep(1.5)' --role raas"
    proc = subprocess.Popen(["sh", "-c", f"({child}) & wait"])  # the subshell: forked, exec'd 0.6 s later
    sampler = broker_jit.CpuSampler(proc.pid, period=0.1)
    try:
        proc.wait(timeout=30)
    finally:
        sampler.stop()
    seen = [s[1] for s in sampler.samples]
    assert "raas" not in seen[0] and "raas" in seen[-1], seen


def test_committed_results_have_the_issues_fields_and_render_with_spread():
    """The tables of docs/benchmarks.md come from these files: each must carry the required numbers,
    its load, and render as median (min–max)."""
    from astraflow.benchmarks import report

    wt = json.loads((report.RES / "weight_transfer.json").read_text())
    for key in ("snapshot_e2e_MBps", "kafka_tool_consume_MBps", "encode_vs_memcpy", "decode_vs_memcpy"):
        assert isinstance(wt[key], float), key
    avs = json.loads((report.RES / "async_vs_sync.json").read_text())
    assert avs["repeats"] >= 3 and not avs["quick"]
    for key in ("overlap_efficiency", "inprocess_s_per_step", "ratio_to_inprocess"):
        assert avs[key]["n"] == avs["repeats"], key
    for name in ("weight_transfer", "async_vs_sync", "engine_throughput", "topics_throughput", "codec_throughput",
                 "publish_dtype"):
        data = json.loads((report.RES / f"{name}.json").read_text())
        assert "loadavg" in data["load"]["before"], name
    text = report.render()
    for section in ("**Async vs sync vs one process**", "**Kafka path**", "**Weight transfer**", "**Rollout engine**"):
        assert section in text
    assert "entropy bound" not in text and "kafka-python MB/s" in text and " (" in text


def test_delta_sparsity_pairs_bytes_by_repetition_and_judges_the_goal_on_the_median():
    """Per learning rate: the delta's share of a snapshot, paired within a repetition; the
    1/20 goal is met only where that share's median is <= 0.05, and the table renders."""
    from astraflow.benchmarks import delta_sparsity

    def run(nbytes, frac):
        return {"delta_bytes": nbytes, "delta_changed_frac": frac, "snapshot_bytes": 3e6,
                "delta_over_snapshot": nbytes / 3e6, "accuracy_final": 0.25, "accuracy_initial": 0.21,
                "s_per_step": 1.0, "load_before": [2.0, 1.0, 1.0]}
    reps = [{"2e-4": run(9e5 + i, 0.45), "5e-6": run(1.2e5 + i * 1e4, 0.04)} for i in range(3)]
    agg = delta_sparsity.aggregate(reps)
    assert agg["by_lr"]["2e-4"]["meets_goal"] is False and agg["by_lr"]["5e-6"]["meets_goal"] is True
    assert agg["by_lr"]["5e-6"]["delta_over_snapshot"]["median"] == pytest.approx(1.3e5 / 3e6)
    reps[1]["5e-6"] = reps[2]["5e-6"] = run(2e5, 0.07)  # the median repetition misses: the goal is missed
    assert delta_sparsity.aggregate(reps)["by_lr"]["5e-6"]["meets_goal"] is False
    one = {**agg, "steps": 40, "repeats": 3, "quick": False, "machine": {"cpus": 2}}
    lines = delta_sparsity.report_rows(lambda name: one if name == "delta_sparsity" else {})
    assert any(line.startswith("| 5e-06") or line.startswith("| 5e-6") for line in lines)
    assert lines.index(next(x for x in lines if x.startswith("| 2e-4"))) < lines.index(
        next(x for x in lines if x.startswith("| 5e-6")))


def _benchmark_imports() -> dict[str, set[str]]:
    """Benchmark module -> the benchmark modules it imports, those imported inside functions too
    (``lib.<name>`` for the shared ones)."""
    import ast

    root = Path(__file__).resolve().parents[1] / "benchmarks"
    files = {".".join(f.relative_to(root).with_suffix("").parts): f for f in [*root.glob("*.py"), *root.glob("lib/*.py")]}
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("astraflow.benchmarks"):
                mod = node.module.removeprefix("astraflow.benchmarks").lstrip(".")
                for alias in node.names:  # `from astraflow.benchmarks[.lib] import <module>` names modules
                    sub = f"{mod}.{alias.name}" if mod else alias.name
                    deps.add(sub if sub in files else mod)
        graph[name] = deps & files.keys() - {name}
    return graph


def test_no_two_benchmark_modules_import_each_other_and_lib_imports_no_benchmark():
    """The shared pieces sit below every benchmark (lib/ imports only lib/), and no chain of
    imports between benchmark modules, inside functions or not, comes back to where it began."""
    graph = _benchmark_imports()
    assert {m: sorted(d) for m, d in graph.items() if m.startswith("lib.") and any(not x.startswith("lib.") for x in d)} == {}
    cycles, done = [], set()

    def visit(m: str, path: list[str]) -> None:
        if m in path:
            cycles.append(path[path.index(m):] + [m])
            return
        if m in done:
            return
        for d in sorted(graph[m]):
            visit(d, [*path, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])
    assert cycles == []


def test_partial_rollouts_on_cpu_pairs_the_arms_by_repetition_and_renders(monkeypatch, tmp_path):
    """The CPU partial-rollouts arms: ratios paired within a repetition (with over without), the
    order alternating; the section renders; and a rerun of the CPU benchmark keeps the section."""
    from astraflow.benchmarks import async_vs_sync_partial as p
    from astraflow.benchmarks import job_bench

    def arm(s, wait, lag, acc):
        return {"s_per_step": s, "weights_wait_s_per_load": wait, "weights_loads": 20.0, "partial_rows": 0.0,
                "partial_recomputed_tokens": 0.0, "token_lag_mean": lag, "staleness_max_mean": 1.0,
                "tokens_per_row": 9.5, "accuracy_initial": 0.2, "accuracy_final": acc, "train_s": 0.9,
                "trainer_wait_s": 0.1, "rollout_busy_s": 0.6}

    reps = [{"without": arm(1.0 + i, 0.4, 0.8, 0.3), "with": arm(0.5 + i, 0.1, 0.4 + i / 10, 0.31)} for i in range(3)]
    agg = p.aggregate(reps)
    assert agg["speedup_with_over_without"]["runs"] == pytest.approx([1 / 0.5, 2 / 1.5, 3 / 2.5])
    assert agg["token_lag_with_over_without"]["runs"] == pytest.approx([0.5, 0.625, 0.75])
    assert agg["weights_wait_with_over_without"]["median"] == pytest.approx(0.25)
    assert agg["arms"]["with"]["accuracy_final"]["n"] == 3
    rows = p.report_rows(lambda name: {"partial_rollouts": {"steps": 30, "repeats": 3, **agg}})
    assert any(r.startswith("| on |") for r in rows) and any(r.startswith("| off |") for r in rows)
    assert any("not emulated" in r for r in rows) and any("trainer busy 0.90" in r for r in rows)

    out = tmp_path / "async_vs_sync.json"
    out.write_text(json.dumps({"partial_rollouts": {"kept": 1}, "emulated": {"kept": 2}, "modes": "old"}))

    class NoBroker:  # the loop's broker is not used by this repetition
        def __init__(self, **_):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(job_bench, "EmbeddedBroker", NoBroker)
    args = job_bench.job_arguments("t", out, ["--out", str(out), "--quick"])
    job_bench.run_repetitions("async_vs_sync", args, lambda a, b, rep: {"x": rep}, lambda reps: {"modes": "new"},
                              lambda agg: None, keep=("emulated", "partial_rollouts"))
    data = json.loads(out.read_text())
    assert data["modes"] == "new" and data["partial_rollouts"] == {"kept": 1} and data["emulated"] == {"kept": 2}


def test_the_real_model_section_pairs_async_with_one_process_on_every_core():
    """``--real-model``: the ratio is paired within each repetition and judged against 1.15 on its
    median; the async_vs_sync table shows it under the CPU one."""
    from astraflow.benchmarks import async_vs_sync

    def mode(s):
        return {"s_per_step": s, "time_to_last_step_s": 10 * s, "accuracy_initial": 0.3, "accuracy_final": 0.4}

    reps = [{"async": {**mode(a), "trainer_threads": 2, "rollout_threads": 1}, "inprocess_all_cores": mode(b)}
            for a, b in ((12.0, 10.0), (11.0, 10.0), (13.0, 10.0))]
    agg = async_vs_sync.aggregate_real(reps)
    assert agg["ratio_to_inprocess_all_cores"]["runs"] == pytest.approx([1.2, 1.1, 1.3])
    assert agg["ratio_to_inprocess_all_cores"]["median"] == pytest.approx(1.2) and not agg["goal_met"]
    reps[2]["async"]["s_per_step"] = 11.4
    assert async_vs_sync.aggregate_real(reps)["goal_met"]  # median 1.14
    data = json.loads((Path(async_vs_sync.RESULTS)).read_text())
    data["real_model"] = {"config": "examples/smollm2_chat_arithmetic.yaml", "steps": 10, "repeats": 3, **agg}
    text = "\n".join(async_vs_sync.report_rows(lambda name: data))
    assert "On the real model" in text and "1.20 (1.10–1.30)" in text and "not met" in text
    assert "trainer on 2 torch thread(s), the RaaS node on 1" in text  # what the async job ran on


def test_lora_rows_are_over_the_full_snapshot_of_the_same_repetition_and_judged_on_the_median():
    """lora.json's rows: every arm's bytes per version over the full model's bf16 snapshot of its
    own repetition; the 1/100 goal judged on the median of the LoRA arms only; the table renders."""
    from astraflow.benchmarks import lora

    def arm(snapshot, delta, rss):  # the first version moves half (a LoRA's B alone), then two steady ones
        return {"snapshot_bytes": snapshot, "delta_bytes": delta, "published_params": 10, "trained_params": 10,
                "versions": [{"delta_bytes": delta / 2}, {"delta_bytes": delta * 0.9}, {"delta_bytes": delta * 1.1}],
                "train_step_s": 1.0, "peak_rss_mb": rss, "rss_after_train_mb": rss / 2}

    reps = [{"full": arm(1000.0 * (i + 1), 500.0, 900.0), "lora_r8": arm(5.0, 5.0 * (i + 1), 400.0),
             "lora_r32": arm(20.0, 30.0, 410.0)} for i in range(3)]
    rows = {r["arm"]: r for r in lora.aggregate(reps)}
    # the steady versions' median (the first, half as big, left out) over the same repetition's snapshot
    assert rows["lora_r8"]["bytes_over_full_snapshot"]["runs"] == pytest.approx([5 / 1000, 10 / 2000, 15 / 3000])
    assert rows["lora_r8"]["first_version_over_full_snapshot"]["runs"] == pytest.approx([2.5 / 1000] * 3)
    assert rows["lora_r32"]["bytes_over_full_snapshot"]["runs"] == pytest.approx([0.03, 0.015, 0.01])
    assert rows["lora_r8"]["meets_goal"] and not rows["lora_r32"]["meets_goal"] and rows["full"]["meets_goal"] is None
    assert rows["lora_r8"]["rank"] == 8 and rows["full"]["rank"] is None
    d = {"quick": False, "config": "examples/smollm2_chat_arithmetic.yaml", "steps": 3, "groups": 4,
         "targets": ["q_proj"], "lora_lr": 1e-4, "repeats": 3, "goal": 0.01, "rows": list(rows.values())}
    text = "\n".join(lora.report_rows(lambda name: d))
    assert "| lora_r8 | 0.00500 (0.00500–0.00500) ✓" in text and "| lora_r32 | 0.01500" in text and "✗" in text
    assert "| 400 (400–400) | 200 (200–200) |" in text  # peak, then resident once trained
    assert lora.report_rows(lambda name: {**d, "quick": True}) == []
    assert lora.arm_overrides(None, 1e-4, ["q_proj"]) == {}
    assert lora.arm_overrides(32, 1e-4, ["q_proj"])["trainer.engine.lora"]["alpha"] == 64.0


def test_a_childs_peak_memory_is_its_own_and_grows_with_what_it_holds():
    """lib.memory.vm_mb reads this process's own address space (not ru_maxrss, which keeps a
    parent's peak across exec): the peak is at least the resident set and rises with a 200 MB
    tensor held. Measured in a fresh child: a long-lived test worker may hand the tensor pages
    its allocator already holds resident (CI saw the resident set not move at all)."""
    child = (
        "import json, torch\n"
        "from astraflow.benchmarks.lib.memory import vm_mb\n"
        "rss, hwm = vm_mb('VmRSS'), vm_mb('VmHWM')\n"
        "held = torch.ones(50_000_000)\n"  # 200 MB, touched
        "out = dict(rss=rss, hwm=hwm, rss_held=vm_mb('VmRSS'), hwm_held=vm_mb('VmHWM'))\n"
        "try:\n"
        "    vm_mb('VmNothing')\n"
        "except KeyError as e:\n"
        "    out['missing'] = str(e)\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    m = json.loads(done.stdout.strip().splitlines()[-1])
    assert m["hwm"] >= m["rss"] > 0
    assert m["rss_held"] >= m["rss"] + 150 and m["hwm_held"] >= m["rss_held"]
    assert "VmNothing" in m["missing"]


def test_a_recorded_config_path_is_relative_to_the_repository_and_reads_back_from_this_checkout(tmp_path):
    inside = results.ROOT / "examples" / "solver_verifier.yaml"
    assert results.repo_relative(inside) == "examples/solver_verifier.yaml"
    assert results.repo_path(results.repo_relative(inside)) == inside and inside.exists()
    outside = tmp_path / "job.yaml"
    assert results.repo_relative(outside) == str(outside.resolve())  # outside the repo: kept absolute
    assert results.repo_path(str(outside)) == outside


def test_a_trainer_metric_is_summed_over_the_windows_steps_by_step_not_by_timestamp():
    """lib.steady.in_steps: the window (first, last] by the step a value reports, whatever its
    timestamp (the last step's value lands a moment after the step's own mark); a node's metric
    (no step) is summed by time (in_time)."""
    from astraflow.benchmarks.lib.steady import in_steps, in_time
    rows = [{"name": "trainer.train_s", "step": k, "ts": 10.0 * k + 0.003, "value": float(k)} for k in range(1, 6)]
    rows += [{"name": "raas.busy_s", "ts": t, "value": 1.0} for t in (15.0, 25.0, 40.0, 41.0)]
    assert in_steps(rows, "trainer.train_s", 2, 4) == 3.0 + 4.0  # step 4's value is at ts 40.003 > the mark 40
    assert in_steps(rows, "trainer.wait_s", 2, 4) == 0.0
    assert in_time(rows, "raas.busy_s", 20.0, 40.0) == 2.0  # 25 and 40; 41 is past the window


def test_a_benchmark_runs_as_its_own_child_only_when_its_flag_is_given():
    from astraflow.benchmarks.lib.child import child_run
    seen = []
    assert child_run(["--train-child", "--seed", "3"], "--train-child", lambda a: seen.append(a) or 7) == 7
    assert seen == [["--train-child", "--seed", "3"]]
    assert child_run(["--seed", "3"], "--train-child", lambda a: seen.append(a) or 7) is None and len(seen) == 1


def test_kafka_clients_pairs_the_two_clients_by_repetition_and_refuses_fewer_than_three():
    from astraflow.benchmarks import kafka_clients as kc

    reps = [{"produce": {"kafka-python": 0.0016, "librdkafka": 0.0004}},
            {"produce": {"kafka-python": 0.0030, "librdkafka": 0.0003}},
            {"produce": {"kafka-python": 0.0012, "librdkafka": 0.0002}}]
    row = kc.aggregate(reps)["produce"]
    assert row["kafka_python_ms"]["runs"] == pytest.approx([1.6, 3.0, 1.2])
    assert row["librdkafka_ms"]["median"] == pytest.approx(0.3)
    # paired within a repetition (4, 10, 6), not the ratio of the medians (1.6 / 0.3)
    assert row["kafka_python_over_librdkafka"]["runs"] == pytest.approx([4.0, 10.0, 6.0])
    assert row["kafka_python_over_librdkafka"]["median"] == pytest.approx(6.0)
    with pytest.raises(SystemExit):
        kc.main(["--repeats", "2"])
