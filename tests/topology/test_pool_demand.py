"""A pool that serves other policies' episodes is busy: the verifier pool must grow.

In the solver-verifier team the verifier's RaaS nodes get no tasks of their own: they answer
the solver's episodes' role calls on ``generate.verifier``. A real verifier node (an
``astraflow node`` process) is kept saturated by a solver-side client over the real broker;
what it writes to ``metrics`` is folded by the autoscaler's own window and rule, with the
elastic verifier pool of ``examples/topology_solver_verifier.yaml`` (min 1, max 2), while
its trainer reports waiting for batches. Before serving time counted as demand the pool
read as idle (no ``raas.busy_s`` at all) and the rule held ("latency, not capacity") or shrank
it to its minimum.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml

from astraflow.actors.generation import GenerationClient
from astraflow.chaos.harness import JobHarness
from astraflow.topics import Metric, ensure_topics, job_topics
from astraflow.topology.launch import load_plan
from astraflow.topology.scaling import Scaler, SignalWindow

from tests.e2e.test_multi_policy import _config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WINDOW_S = 12.0
CALLERS = 8  #: solver episodes calling at once: more than one verifier node answers in time


def _plan(tmp_path, cfg):
    topo = yaml.safe_load((ROOT / "examples" / "topology_solver_verifier.yaml").read_text())
    topo["regions"]["local"]["pools"]["verifier-raas"].update(min=1, max=2)
    topo["autoscaler"].update(window_s=WINDOW_S, interval_s=2, cooldown_s=0, confirm=2)
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo))
    return load_plan(path, cfg)


def _trainer_waiting(policy: str, start: float, end: float) -> list[Metric]:
    """The verifier trainer's per-step metrics: a step every 2 s, 90% of it waiting for a batch
    (what a trainer starved by its pool reports; the trainer is not what is under test)."""
    out, ts, step = [], start, 1
    while ts <= end:
        for name, value in (("trainer.wait_s", 1.8), ("trainer.train_s", 0.2)):
            out.append(Metric(f"trainer.{policy}", name, value, step, ts, {}))
        ts, step = ts + 2.0, step + 1
    return out


def test_a_verifier_pool_that_only_serves_the_solvers_episodes_reads_busy_and_grows(bootstrap, tmp_path):
    from transformers import AutoTokenizer

    from astraflow.actors.common import model_path
    cfg = _config(tmp_path, "pool-demand", {"rollout.heartbeat_s": 1.0})
    plan = _plan(tmp_path, cfg)
    pool = plan.pools["verifier-raas"]
    assert pool.policy == "verifier" and pool.elastic
    topics = job_topics(cfg)
    ensure_topics(bootstrap, topics.specs())
    tok = AutoTokenizer.from_pretrained(str(model_path(cfg.view("verifier"))))
    h = JobHarness(cfg, bootstrap, tmp_path / "run")
    node = plan.node_spec(pool, 0).node_id
    h.start("raas", node, policy="verifier")
    client = GenerationClient(bootstrap, topics, "solver-raas-0", timeout_s=120)
    stop, errors = threading.Event(), []
    prompts = [tok.encode(f"{i}+{i}=", add_special_tokens=False) for i in range(8)]

    def episode_calls(k: int) -> None:  # one solver episode after another, each asking the verifier
        n = 0
        while not stop.is_set():
            try:
                client.generate("verifier", "verifier", f"ep-{k}-{n}", prompts, [k * 1000 + n * 10 + j for j in
                                                                                 range(len(prompts))],
                                {"temperature": 1.0, "max_new_tokens": 16}, tok)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return
            n += 1
    callers = [threading.Thread(target=episode_calls, args=(k,), daemon=True) for k in range(CALLERS)]
    try:
        for t in callers:  # the requests wait on generate.verifier while the node loads its model
            t.start()
        h.wait_for(lambda m: m.name == "raas.serve_busy_s" and m.labels.get("node") == node, 300,
                   "the verifier node's serving time")
        start = time.time()
        while time.time() - start < WINDOW_S + 2:
            h.poll_metrics(500)
        stop.set()
        for t in callers:
            t.join(60)
        h.poll_metrics(500)
    finally:
        stop.set()
        client.close()
        h.stop_all()
    assert not errors, errors
    mine = [m for m in h.metrics if m.labels.get("node") == node]
    assert not [m for m in mine if m.name == "raas.busy_s"]  # no task of its own: the old signal read it idle
    served = [m for m in mine if m.name == "raas.serve_busy_s" and m.ts >= start]
    assert served and all(m.labels.get("policy") == "verifier" for m in served)

    end = max(m.ts for m in served)
    policy_of = lambda n: plan.pool_of(n).policy if plan.pool_of(n) else None  # noqa: E731 - the autoscaler's
    window = SignalWindow("verifier", WINDOW_S, policy_of, cfg.rollout.heartbeat_s)
    for m in sorted(_trainer_waiting("verifier", start, end) + h.metrics, key=lambda m: m.ts):
        window.add_metric(m)
    s = window.signals(end)
    assert s.wait_frac is not None and s.wait_frac > 0.5
    assert s.demand >= plan.autoscaler["scale_up_busy"], s  # one node, busy most of the window
    scaler = Scaler(pool.min, pool.max, **plan.autoscaler)
    decisions = [scaler.decide(s, 1, now=end + i) for i in range(plan.autoscaler["confirm"])]
    assert (decisions[-1].action, decisions[-1].target) == ("up", 2), decisions
