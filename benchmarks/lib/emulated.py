"""A run's emulated-device accounts: what each pool and trainer did, in modelled seconds.

Every emulated component reports per kind of call (``generate``, ``train``, ``weight_load``)
its modelled, held and CPU seconds (``summary.json``'s ``emulated``, :mod:`astraflow.emulation.device`).
Here those accounts become work per resource and per batch, the CPU share of the holds
(how far the instrument measured the CPU, not the device), and the episodes a pool's devices
worked on. Resources are named as the run names them: ``raas-<policy>-<i>`` (a node of a
policy's pool), ``trainer.<policy>``, and ``shared.<policy>`` for a pool and trainer taking
turns on the same devices. Knows nothing about any benchmark's arms or tables.
"""

from __future__ import annotations

from astraflow.benchmarks.lib.run_metrics import total


def modelled_s(component: dict) -> float:
    """One component's modelled seconds over all its kinds of call (an ``emulated`` summary entry)."""
    return sum(c.get("modelled_s", 0.0) for c in component.values() if isinstance(c, dict))


def cpu_fractions(emulated: dict) -> dict[str, float]:
    """Per component, the real work's CPU seconds over its held seconds (all calls)."""
    out = {}
    for comp, d in emulated.items():
        calls = [c for c in d.values() if isinstance(c, dict)]
        held = sum(c.get("held_s", 0.0) for c in calls)
        cpu = sum(c.get("cpu_fraction", 0.0) * c.get("held_s", 0.0) for c in calls)
        out[comp] = round(cpu / held, 4) if held else 0.0
    return out


def overruns(emulated: dict) -> int:
    """Calls whose real work outlasted their hold (the instrument measured the CPU there)."""
    return int(sum(c.get("overruns", 0) for d in emulated.values() for c in d.values() if isinstance(c, dict)))


def resource_work(summary: dict, episodes: float, groups_per_batch: int, steps: int) -> dict[str, float]:
    """Per pool and trainer of a Kafka arm, its modelled seconds per iteration: pools' over the
    episodes they rolled out scaled to a batch, trainers' per step."""
    out = {}
    for comp, d in summary.get("emulated", {}).items():
        total_s = modelled_s(d)
        if comp.startswith("trainer"):
            out[comp] = total_s / steps
        elif episodes:
            out[comp] = total_s * groups_per_batch / episodes
    return out


def per_node(rows: list[dict], name: str) -> dict[str, float]:
    """Each node's last (largest) value of running count ``name``."""
    last: dict[str, float] = {}
    for r in rows:
        if r["name"] == name:
            node = r.get("label.node", "")
            last[node] = max(last.get(node, 0.0), float(r["value"]))
    return last


def last_per_node(rows: list[dict], name: str) -> float:
    """The sum over nodes of each node's last (largest) value of running count ``name``."""
    return sum(per_node(rows, name).values())


def episodes_fenced(rows: list[dict]) -> float:
    """Episodes rolled out in polls that were fenced (dropped at their commit after a rebalance):
    ``raas.fenced_tasks`` is each node's running count, so its last value per node."""
    return last_per_node(rows, "raas.fenced_tasks")


def episodes_worked(rows: list[dict]) -> float:
    """Every episode a pool's devices worked on: those committed (``raas.tasks``), those of
    fenced polls (redone elsewhere) and those of polls still rolling out when the run's record
    ends (``raas.tasks_in_flight``, each node's last report, sent with its device totals; with
    several polls in flight that tail is up to ``polls_in_flight`` polls). Pricing a pool's
    work per batch over fewer episodes than its devices worked on would make the "lower bound"
    exceed the time measured. Counting a barely begun episode as a whole one errs the other
    way: the bound stays a bound."""
    committed = total(rows, "raas.tasks")
    in_flight: dict[str, tuple[float, float]] = {}  # node -> (ts, value) of its last report: a gauge
    for r in rows:
        if r["name"] == "raas.tasks_in_flight":
            node, ts = r.get("label.node", ""), float(r.get("ts", 0.0))
            if node not in in_flight or ts >= in_flight[node][0]:
                in_flight[node] = (ts, float(r["value"]))
    return committed + episodes_fenced(rows) + sum(v for _, v in in_flight.values())


def stage_of(comp: str) -> tuple[str, str]:
    """A Kafka arm's emulated resource as (policy, stage): ``raas-<policy>-<i>`` -> (policy,
    "rollout"), ``trainer.<policy>`` -> (policy, "trainer"), ``shared.<policy>`` (a pool and
    trainer taking turns, :func:`merge_shared`) -> (policy, "shared")."""
    if comp.startswith(("trainer.", "shared.")):
        kind, policy = comp.split(".", 1)
        return policy, kind
    return comp.split("-", 1)[1].rsplit("-", 1)[0], "rollout"


def merge_shared(work: dict[str, float], shared: set[str] | dict[str, str]) -> dict[str, float]:
    """Per resource work with each shared policy's pool and trainer as one resource,
    ``shared.<policy>`` (their devices are the same: their work adds up); ``shared`` as a
    mapping: component -> the resource it shares (e.g. two policies' trainers on one device share)."""
    out: dict[str, float] = {}
    for comp, v in work.items():
        if isinstance(shared, dict):
            key = shared.get(comp, comp)
        else:
            p, _ = stage_of(comp)
            key = f"shared.{p}" if p in shared else comp
        out[key] = out.get(key, 0.0) + v
    return out
