"""Elastic RaaS pools on cost-model emulated accelerators (``elastic --emulated``).

The three arms of ``elastic.py`` (``fixed_small``, ``fixed_large``, ``autoscaling``) through
``astraflow launch``, with the trainer pool and the RaaS pool on **cost-model emulated
devices** (``device: {kind: h100, count: N, emulate: PROFILE, dilation: D, token_scale: K,
prompt_token_scale: P}``; default 2 x H100 for the trainer and one H100 per RaaS node, the
Qwen3-8B shape): the tiny model computes every token and gradient, each call is held for
the time ``emulation/cost.py`` gives for it at the emulated scale. Everything else is the
CPU arms' (embedded broker, dataflow, autoscaler, heartbeat accounting, audit); the job
is the demo job's task and model with 32 prompts x 8 samples per step and 16 prompts per
call (two calls of 128 rows per batch): a decode step of 16 rows would be mostly the
device's per-step overhead, and the rollout would dwarf any training step.

**Pool sizes, from the cost model** (printed with every run): one call of ``tasks_per_call``
prompts x ``n_samples`` rows is priced on one device (``CostModel.generate_s``, prompt and
completion lengths the arithmetic problems' own: prompt characters, the answer plus EOS),
plus a weight load per node and version; one training step of a batch on the trainer's
``k`` devices (``CostModel.train_step_s``: the demo's GRPO step is one forward and backward,
no forward-only pass). The **balance point** is the pool at which the rollout of a batch
takes as long as a step::

    N* = calls_per_batch x call_s / (train_s - weight_load_s)

and the arms take ``small = max(1, round(N* / 2))`` (its rollout takes about twice a step:
the trainer waits about half the time) and ``large = max(small + 1, round(2 N*))`` (about
half its devices' time idle). With the defaults (h100-qwen3-8b, token scale 512, prompt
scale 16, 2 trainer devices — the fewest its training states fit on): call 27.7 s, step
28.5 s, weight load 0.66 s, ``N* = 1.99``: small 1, large 4. Priced per step, (trainer +
pool devices) x max(rollout, step) is 168 device-seconds for small, 114 at the balance point
and 171 for large: the fixed arms cost the same, so the verdict turns on where the
autoscaler settles between them.

**Device-hours are modelled hours.** The launcher's ``summary["device_hours"]`` counts wall
time between heartbeats (``topology/accounting.py``); every emulated device here runs at
one ``dilation`` (wall seconds per modelled second), so this benchmark converts each arm's
figures to modelled hours as ``wall device-hours / dilation`` (its seconds: ``modelled_s``)
and keeps the wall figures beside them (``wall_*``, ``wall_s``). A node's boot is converted at the
same rate: the CPU seconds this box takes to start a node count as ``1 / dilation`` modelled
seconds of a held device (about what loading an 8B model onto a GPU takes at the default
dilation, but not measured). Every number is **emulated, modelled**, not a GPU measurement;
accuracy is the tiny model's, not an 8B one's.

Writes the ``emulated`` section of ``benchmarks/results/elastic.json`` (the CPU arms stay
as measured) and ``elastic_emulated.png``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from astraflow.benchmarks.elastic_arms import ARMS, job_settings, plot, run_arm
from astraflow.benchmarks.elastic_arms import topology as arm_topology
from astraflow.benchmarks.lib.emulated import cpu_fractions, overruns
from astraflow.benchmarks.lib.results import load_now, write_section
from astraflow.benchmarks.lib.run_metrics import read_rows
from astraflow.benchmarks.lib.stats import spread
from astraflow.emulation.cost import CostModel
from astraflow.emulation.profile import load_profile
from astraflow.workflows.arithmetic import generate_problems

#: the job's shape in the emulated arms: two calls of 128 rows per batch (see the module docstring)
GROUPS_PER_BATCH, TASKS_PER_CALL, N_SAMPLES = 32, 16, 8
#: steps per arm unless --steps says otherwise: a small-pool step is ~2 x 28.5 modelled s
DEFAULT_STEPS = 15


def cost_model(a: argparse.Namespace):
    return CostModel(load_profile(a.profile), a.token_scale, a.prompt_token_scale)


def row_lengths(seed: int, n: int = 200) -> tuple[int, int]:
    """Mean real prompt and completion tokens of the job's problems (char tokenizer: a
    token per character; a completion is the answer and its EOS)."""
    probs = generate_problems(n, seed=seed)
    return (round(sum(len(p.prompt) for p in probs) / n), round(sum(len(p.answer) + 1 for p in probs) / n))


def price(a: argparse.Namespace) -> dict:
    """The balance point and the arms' pool sizes, from the cost model (see the module docstring)."""
    cost = cost_model(a)
    trainer_devices = a.trainer_devices or cost.min_train_devices()
    prompt, completion = row_lengths(a.seed)
    rows_per_call = TASKS_PER_CALL * N_SAMPLES
    calls = GROUPS_PER_BATCH // TASKS_PER_CALL
    call_s = cost.generate_s([prompt] * rows_per_call, [completion] * rows_per_call)
    rows = GROUPS_PER_BATCH * N_SAMPLES
    train_s = cost.train_step_s(cost.modelled_tokens(prompt * rows, completion * rows), 0, devices=trainer_devices)
    load_s = cost.weight_load_s()
    if train_s <= load_s:
        raise ValueError(f"a training step ({train_s:.2f} s) is shorter than a weight load ({load_s:.2f} s) on "
                         f"{a.profile}: no pool keeps up; raise --token-scale or lower --trainer-devices")
    balance = calls * call_s / (train_s - load_s)
    small = a.small or max(1, round(balance / 2))
    large = a.large or max(small + 1, round(2 * balance))

    def rollout_s(n: int) -> float:  # a batch's rollout on n nodes (calls spread evenly), one weight load each
        return calls * call_s / n + load_s

    return {"profile": a.profile, "token_scale": a.token_scale, "prompt_token_scale": a.prompt_token_scale,
            "trainer_devices": trainer_devices, "prompt_tokens": prompt, "completion_tokens": completion,
            "rows_per_call": rows_per_call, "calls_per_batch": calls, "call_s": round(call_s, 3),
            "weight_load_s": round(load_s, 3), "train_s": round(train_s, 3), "balance_nodes": round(balance, 3),
            "small": small, "large": large, "sizes_from_rule": not (a.small or a.large),
            # what the cost model predicts each fixed arm does (before Kafka, boots and the tiny model's CPU)
            "predicted": {name: {"rollout_s_per_batch": round(rollout_s(n), 2),
                                 "s_per_step": round(max(rollout_s(n), train_s), 2),
                                 "trainer_wait_frac": round(max(0.0, 1 - train_s / rollout_s(n)), 3),
                                 "pool_busy_frac": round(min(1.0, rollout_s(n) / train_s) if n else 0.0, 3),
                                 "device_s_per_step": round((trainer_devices + n) * max(rollout_s(n), train_s), 1)}
                          for name, n in (("fixed_small", small), ("balance", max(1, round(balance))),
                                          ("fixed_large", large))}}


def rule_text(p: dict) -> str:
    pr = p["predicted"]
    return (f"pricing ({p['profile']}, token scale {p['token_scale']}, prompt scale {p['prompt_token_scale']}; "
            f"modelled s): a call of {p['rows_per_call']} rows ({p['prompt_tokens']}+{p['completion_tokens']} real "
            f"tokens) {p['call_s']:.2f} s on one device, {p['calls_per_batch']} calls per batch; a weight load "
            f"{p['weight_load_s']:.2f} s; a training step {p['train_s']:.2f} s on {p['trainer_devices']} devices\n"
            f"balance N* = {p['calls_per_batch']} x {p['call_s']:.2f} / ({p['train_s']:.2f} - {p['weight_load_s']:.2f})"
            f" = {p['balance_nodes']:.2f} nodes; small = max(1, round(N*/2)) = {p['small']}, large = max(small+1, "
            f"round(2 N*)) = {p['large']}" + ("" if p["sizes_from_rule"] else " (sizes given on the command line)")
            + f"\npredicted: small's trainer waits {pr['fixed_small']['trainer_wait_frac']:.0%}, large's pool is "
            f"busy {pr['fixed_large']['pool_busy_frac']:.0%}; device-s per step small "
            f"{pr['fixed_small']['device_s_per_step']}, balance {pr['balance']['device_s_per_step']}, large "
            f"{pr['fixed_large']['device_s_per_step']}")


def devices(a: argparse.Namespace, trainer_devices: int) -> tuple[dict, dict]:
    """The trainer's and a RaaS node's cost-model emulated devices (topology ``device`` sections)."""
    kind = a.profile.split("-", 1)[0]  # h100-qwen3-8b -> h100: the label device-hours are counted under
    em = {"emulate": a.profile, "dilation": a.dilation, "token_scale": a.token_scale,
          "prompt_token_scale": a.prompt_token_scale}
    return {"kind": kind, "count": trainer_devices, **em}, {"kind": kind, "count": 1, **em}


def topology(arm: str, a: argparse.Namespace, trainer_devices: int) -> dict:
    trainer, raas = devices(a, trainer_devices)
    return arm_topology(arm, a, trainer_device=trainer, raas_device=raas)


def settings(a: argparse.Namespace) -> dict:
    return job_settings(a.steps, a.problems, GROUPS_PER_BATCH, TASKS_PER_CALL)


def modelled(row: dict, dilation: float) -> dict:
    """An arm's row with its device-hours, cost and seconds in modelled units (wall / dilation);
    the wall figures kept as ``wall_*``."""
    out = dict(row)
    for key in ("total_device_hours", "rollout_device_hours", "trainer_device_hours", "cost", "time_to_first_step_s"):
        if out.get(key) is not None:
            out[f"wall_{key}"] = row[key]
            out[key] = round(row[key] / dilation, 5)
    out["modelled_s"] = round(row["wall_s"] / dilation, 1)  # wall_s stays the wall seconds
    return out


def instrument(accounts: dict) -> dict:
    """How well the emulation held: calls whose real work outlasted the hold, and the largest
    share of a component's held time its real work took on the CPU."""
    return {"overruns": overruns(accounts), "cpu_fraction": cpu_fractions(accounts)}


def summarize(rows: list[dict]) -> dict:
    """An arm over its repetitions: the repetition of median total device-hours as the arm's
    row (its every figure from one run), each repetition under ``repetitions``, and the spread
    of the figures the verdict and the table read."""
    ranked = sorted(rows, key=lambda r: r["total_device_hours"])
    out = {**ranked[(len(ranked) - 1) // 2], "repetitions": rows}
    for key in ("total_device_hours", "modelled_s", "trainer_wait_frac"):
        out[f"{key}_spread"] = spread([r[key] or 0.0 for r in rows])
    out["overruns_total"] = sum(r["instrument"]["overruns"] for r in rows)
    out["complete"] = all(r["complete"] for r in rows)
    return out


def verdict(reps: dict[str, list[dict]]) -> dict:
    """Autoscaling against each fixed arm in modelled device-hours, repetition by repetition
    (paired: the k-th runs of the arms ran one after another), and their median (min–max)."""
    auto = [r["total_device_hours"] for r in reps["autoscaling"]]
    out: dict = {}
    for k in ("fixed_small", "fixed_large"):
        s = spread([x / r["total_device_hours"] - 1 for x, r in zip(auto, reps[k])])
        out[f"autoscaling_vs_{k}"] = round(s["median"], 4)
        out[f"autoscaling_vs_{k}_spread"] = s
    out["below_both"] = out["autoscaling_vs_fixed_small"] < 0 and out["autoscaling_vs_fixed_large"] < 0
    out["below_both_every_repetition"] = all(max(out[f"autoscaling_vs_{k}_spread"]["runs"]) < 0
                                             for k in ("fixed_small", "fixed_large"))
    accs = [r["accuracy"] for rows in reps.values() for r in rows if r["accuracy"] is not None]
    out["accuracy_spread"] = round(max(accs) - min(accs), 4) if accs else None
    out["valid"] = all(r["complete"] for rows in reps.values() for r in rows)
    return out


def table(result: dict) -> str:
    lines = [f"EMULATED: trainer on {result['pricing']['trainer_devices']} and each RaaS node on 1 emulated "
             f"{result['profile']} device (dilation {result['dilation']}; device-hours and seconds MODELLED)",
             f"{'arm':12} {'model s':>8} {'wait':>6} {'pool':>9} {'rollout dh':>11} {'trainer dh':>11} "
             f"{'total dh':>9} {'acc':>6} {'overruns':>8}"]
    for arm in ARMS:
        if arm not in result:
            continue
        r = result[arm]
        lines.append(f"{arm + ('' if r.get('complete', True) else '*'):12} {r['modelled_s']:8.0f} {r['trainer_wait_frac'] or 0:6.2f} "
                     f"{r['pool_mean'] or 0:4.1f}/{r['pool_max'] or 0:<4.0f} {r['rollout_device_hours']:11.4f} "
                     f"{r['trainer_device_hours']:11.4f} {r['total_device_hours']:9.4f} "
                     f"{r['accuracy'] if r['accuracy'] is not None else float('nan'):6.3f} "
                     f"{r.get('overruns_total', r['instrument']['overruns']):8d}")
    if "verdict" in result:
        v = result["verdict"]
        sp = lambda k: (f" ({v[k + '_spread']['min']:+.1%}..{v[k + '_spread']['max']:+.1%})"  # noqa: E731
                        if k + "_spread" in v else "")
        lines.append(f"autoscaling vs fixed_small {v['autoscaling_vs_fixed_small']:+.1%}{sp('autoscaling_vs_fixed_small')}, "
                     f"vs fixed_large {v['autoscaling_vs_fixed_large']:+.1%}{sp('autoscaling_vs_fixed_large')} modelled "
                     f"device-hours, median of {result.get('repeats', 1)} repetition(s) (seed: -13%)"
                     + ("" if v.get("valid", True) else "  NOT VALID: an arm stopped short or failed its audit"))
    return "\n".join(lines)


def main(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    from astraflow.topics import EmbeddedBroker  # the Kafka client (~0.7 s to import): only when the arms run
    a.steps = a.steps or DEFAULT_STEPS
    a.repeats = a.repeats or (1 if a.quick else 3)
    if a.quick:
        a.steps, a.problems, a.window, a.cooldown, a.interval = 3, 10, 10.0, 10.0, 2.0
    p = price(a)
    a.small, a.large, a.trainer_devices = p["small"], p["large"], p["trainer_devices"]
    if a.small < 1 or a.large <= a.small:
        ap.error(f"need 1 <= --small < --large, got {a.small} and {a.large}")
    print(rule_text(p), flush=True)
    from astraflow.actors.rollout import TASK_SESSION_TIMEOUT_MS  # the RaaS node (~0.5 s to import): only here
    if p["call_s"] * a.dilation > 0.8 * TASK_SESSION_TIMEOUT_MS / 1000:
        # kafka-python finishes a rebalance only inside poll(): a node held longer than the task
        # consumer's session timeout while one starts is dropped from the group and its poll
        # fenced; in two such runs (dilation 0.4, 11 s holds) the fenced tasks were never redone
        # and the trainer starved on its last batch.
        print(f"WARNING: a call is held {p['call_s'] * a.dilation:.1f} s wall, near the task consumer's "
              f"{TASK_SESSION_TIMEOUT_MS / 1000:.0f} s session timeout: lower --dilation", flush=True)
    load_before = load_now()
    run_root = Path(a.run_root)
    reps: dict[str, list[dict]] = {arm: [] for arm in a.arms}
    with EmbeddedBroker(run_root / f"kafka-{int(time.time())}", heap="1g") as broker:
        for rep in range(a.repeats):
            # the arms in turn, their order reversed every other repetition, so a drift of the
            # machine's load over the run falls on every arm alike
            for arm in (a.arms if rep % 2 == 0 else a.arms[::-1]):
                print(f"--- {arm}, repetition {rep + 1} of {a.repeats}", flush=True)
                row = run_arm(arm, a, broker.bootstrap_servers, run_root, settings(a),
                                      topology(arm, a, p["trainer_devices"]))
                accounts = row.pop("emulated_accounts")
                reps[arm].append({**modelled(row, a.dilation), "instrument": instrument(accounts),
                                  # a run that stopped short (timeout, stall) or lost records compares nothing
                                  "complete": row["steps_trained"] == a.steps and row["audit_ok"]})
    arms = {arm: summarize(rows) for arm, rows in reps.items()}
    section = {"emulated": True, "quick": a.quick, "profile": a.profile, "dilation": a.dilation,
               "token_scale": a.token_scale, "prompt_token_scale": a.prompt_token_scale, "steps": a.steps,
               "repeats": a.repeats,
               "job_shape": {"groups_per_batch": GROUPS_PER_BATCH, "tasks_per_call": TASKS_PER_CALL,
                             "n_samples": N_SAMPLES},
               "device_hours_unit": ("modelled hours: the launcher's heartbeat device-hours (wall) / dilation, "
                                     "converted in this benchmark (wall_* keep the wall figures); a node's boot on "
                                     "this CPU is converted at the same rate"),
               "pricing": p, **arms,
               "settings": {k: v for k, v in vars(a).items() if k not in ("out", "run_root")},
               "method": __doc__}
    if all(k in arms for k in ARMS):
        section["verdict"] = verdict(reps)
    print(table(section))
    out = Path(a.out)
    if "autoscaling" in arms:
        rows = read_rows(Path(arms["autoscaling"]["run_dir"]) / "run")
        plot(out.with_name(out.stem + "_emulated.png"), rows,
                     title=f"EMULATED autoscaling arm ({a.profile}, dilation {a.dilation}): pool size and trainer wait")
    write_section(out, "emulated", section, load_before, "elastic")
    return 0


# -- its results tables: benchmarks/report.py renders every benchmark's from these --------
from astraflow.benchmarks.report_format import (  # noqa: E402 (kept with the tables)
    Loader, heading, load_note, fmt_spread as _sp)


REPORT_TITLE = "Elastic RaaS pools, EMULATED"


def report_rows(load: Loader) -> list[str]:
    """This benchmark's section of docs/benchmarks.md: the ``emulated`` section of ``elastic.json`` (none for a
    quick run)."""
    d = (load("elastic") or {}).get("emulated")
    if not d or d.get("quick"):
        return []
    pr = d["pricing"]
    out = [*heading(REPORT_TITLE),
           f"**Elastic RaaS pools, EMULATED** — `python -m astraflow.benchmarks.elastic --emulated` (the demo job, "
           f"{d['job_shape']['groups_per_batch']} prompts × {d['job_shape']['n_samples']} samples per step, "
           f"{d['steps']} steps per arm, through `astraflow launch`; trainer on {pr['trainer_devices']} and each "
           f"RaaS node on 1 emulated {d['profile']} device; pool sizes from the cost model's balance point N* = "
           f"{pr['balance_nodes']:.2f} nodes: small {pr['small']}, large {pr['large']}; **modelled device-hours** "
           f"(heartbeat wall hours / dilation {d['dilation']}), not GPU measurements; "
           + (f"the median repetition of {d['repeats']}, arms interleaved" if d.get("repeats", 1) > 1 else "one run")
           + f"{load_note(d)})", "",
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
