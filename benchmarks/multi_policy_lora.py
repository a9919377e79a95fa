"""Table 2's arm (d), EMULATED: both policies as LoRA adapters of one base, on one shared pool and one trainer's devices.

``python -m astraflow.benchmarks.multi_policy --emulated --lora-arm`` runs it after Table 2, with
Table 2's recorded settings (profile, devices, dilation, token scales, workload, staleness, steps,
config), ``--repeats`` times, each repetition paired with Table 2's (c) and (a) of the same index.
Writes the ``lora_shared`` section of ``multi_policy_emulated.json`` (Table 2 stays).

The arm (issue 59, item 6): the team's two policies are LoRA adapters (``--lora-rank``, alpha 2 x
rank, on all seven projection modules) of ONE base model:

* **one pool** of ``--lora-split``'s first number of devices: the lead policy's RaaS node holds the
  base once and both adapters, and generates both roles' rows, each under its own adapter and
  version (``policies.<other>.rollout.pool``);
* **one trainer's devices** (the second number): both policies' trainers name one
  ``device.share`` and take turns on it, paying no swap (the base and both adapters' states stay
  resident, as in one trainer process training each adapter in turn);
* priced as LoRA on the profile's shape (``emulation/cost.py``): a step without the frozen
  base's weight gradients, a version's load of the adapter's bytes, training states of the
  bf16 base plus the adapters'.

The real engine behind it is the tiny ``team`` warm start (``astraflow model init --task team``:
one base taught both roles), because a shared pool serves adapters of one base; Table 2's
(a)-(c) run a solver model and a verifier model. The modelled lengths come from the rows the
real engine writes, so (d)'s work is close to, not the same as, (a)'s; the comparison says so.
The steady window, bound and efficiency are Table 2's (``lib/steady.py``), with the two trainers
one resource (``shared.trainers``: their work adds up on the same devices).
"""

from __future__ import annotations

from astraflow.benchmarks.lib.results import load_now, write_section
from astraflow.benchmarks.lib.stats import fmt_spread, ratio_spread, spread, spread_each
from astraflow.benchmarks.lib.steady import steps_for_window, whole_run_fields
from astraflow.benchmarks.multi_policy_emulated_arms import SEED_SHAPE, device, run_split, shaped
from astraflow.benchmarks.multi_policy_resplit import steady_table2, with_table2_settings

SECTION = "lora_shared"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TRAINERS = "lora-trainers"  #: the device share both trainers name
BASE_TASK = "team"  #: the tiny warm start that plays both roles


def lead_policy(data: dict) -> str:
    """The policy playing the workflow's first role (its pool runs the episodes)."""
    from astraflow.workflows.api import get_workflow  # the workflow registry
    wf = data.get("workflow") or {}
    first = get_workflow(wf.get("name", "solver_verifier")).roles[0]
    return (wf.get("roles") or {}).get(first, first)


def lora_team_config(base: dict, args, pool: int, trainer: int, barrier: str, job: str, run_dir: str,
                     rank: int) -> dict:
    """Arm (d)'s job: Table 2's team in the seed's shape, both policies LoRA adapters of the
    ``team`` base, the other policy's rows on the lead's pool of ``pool`` devices, both trainers
    taking turns on ``trainer`` devices."""
    data = shaped(base, args)
    data.update(job=job, barrier=barrier, run_dir=run_dir, model={"task": BASE_TASK})
    data["trainer"]["steps"] = steps_for_window(args.steps, args.max_staleness)
    lead = lead_policy(data)
    lora = {"rank": rank, "alpha": 2.0 * rank, "target_modules": list(TARGETS)}
    pool_device = device(args, pool)
    for p, sec in data["policies"].items():
        sec["model"] = {"task": BASE_TASK}
        tr = sec.setdefault("trainer", {})
        tr["device"] = {**device(args, trainer), "share": TRAINERS}
        tr.setdefault("engine", {})["lora"] = dict(lora)
        ro = sec.setdefault("rollout", {})
        ro["device"] = dict(pool_device)  # a served policy's rows run on the pool's devices
        if p == lead:
            ro.update(nodes=1, tasks_per_call=SEED_SHAPE["groups_per_batch"], polls_in_flight=args.polls_in_flight)
        else:
            ro["pool"] = lead
    return data


def lora_main(args) -> int:
    """``multi_policy --emulated --lora-arm``: arm (d) ``--repeats`` times with Table 2's settings."""
    table2 = steady_table2(args.out, "run arm (d) beside")
    base = with_table2_settings(args, table2)
    pool, trainer = (int(x) for x in args.lora_split.split(","))
    if pool + trainer != args.devices:
        raise SystemExit(f"--lora-split {args.lora_split}: {pool + trainer} devices, Table 2 has {args.devices}")
    shared = {f"trainer.{p}": f"shared.{TRAINERS}" for p in base["policies"]}
    load_before = load_now()
    reps = []
    for rep in range(args.repeats):
        print(f"--- repetition {rep + 1}: (d) LoRA adapters on one pool ({pool} devices) and one trainer's devices "
              f"({trainer})", flush=True)

        def config(job: str, run_dir: str) -> dict:
            return lora_team_config(base, args, pool, trainer, "async", job, run_dir, args.lora_rank)
        reps.append(run_split(base, args, {}, "async", rep, config=config, shared=shared))
    section = {"emulated": True, **aggregate(reps, table2), "split": {"pool": pool, "trainer": trainer},
               "lora": {"rank": args.lora_rank, "alpha": 2.0 * args.lora_rank, "targets": list(TARGETS)},
               "base_task": BASE_TASK, "method": __doc__, "table2_created": table2.get("created"),
               "pairing": "repetition i with repetition i of Table 2's (c) and (a)", "repetitions": reps}
    r = section["arm"]
    print(f"(d) LoRA, one pool + one trainer's devices (EMULATED): s/iter {fmt_spread(r['s_per_iter'], '.1f')}  bound "
          f"{fmt_spread(r['lower_bound_s_per_iter'], '.1f')}  eff {fmt_spread(r['scheduling_efficiency'])}  vs (c) "
          f"{fmt_spread(r['speedup_vs_sequential'])}  vs Table 2's (a) {fmt_spread(r['speedup_vs_table2_async'])}")
    write_section(args.out, SECTION, section, load_before, "multi_policy_emulated")
    return 0


def aggregate(reps: list[dict], table2: dict) -> dict:
    """(d)'s spreads, and its ratios to Table 2's (c) and (a) paired by repetition index."""
    c = [r["colocated"]["s_per_iter"] for r in table2["repetitions"]]
    a = [r["async"]["s_per_iter"] for r in table2["repetitions"]]
    s = [x["s_per_iter"] for x in reps]
    n = min(len(s), len(c))
    return {"arm": {
        "s_per_iter": spread(s), "lower_bound_s_per_iter": spread([x["lower_bound_s_per_iter"] for x in reps]),
        "scheduling_efficiency": spread([x["lower_bound_s_per_iter"] / x["s_per_iter"] for x in reps]),
        "busiest": [x["busiest"] for x in reps], "overruns": spread([x["overruns"] for x in reps]),
        "work_in_window_by_resource": spread_each(reps, "work_in_window_by_resource"), **whole_run_fields(reps),
        "speedup_vs_sequential": ratio_spread(spread(c[:n]), spread(s[:n])),
        "speedup_vs_table2_async": ratio_spread(spread(a[:n]), spread(s[:n]))}}
