"""Chaos scenarios: the YAML schema of ``astraflow chaos SCENARIO.yaml``, validated at load time.

A scenario names a job config (relative to the scenario file) with overrides, the Kafka
cluster to run it on (one broker or three), and a fault schedule: faults at a time since
the components started (``at_s``), at a trainer step (``at_step``), or drawn at random
every ``every_s`` seconds from a seeded generator. This module only reads and checks the
file; :mod:`.faults` injects and :mod:`.runner` runs. An unknown key, kind or target is a
:class:`ScenarioError` that names the file and the key.

Example::

    job:
      config: ../../examples/arithmetic_grpo.yaml
      set: {trainer.steps: 8, rollout.nodes: 2}
    brokers: 1
    seed: 0
    faults:
      - {at_step: 2, kind: sigkill, target: raas-0}
      - {at_s: 40, kind: sigstop, target: raas, resume_after_s: 15}
      - random: {every_s: 30, kinds: [sigkill, partition], targets: [raas, trainer]}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from astraflow.errors import FatalError
from astraflow.typed_config import check_name, load_yaml

#: Faults on one component process, and the parameters each kind takes (with defaults).
PROCESS_KINDS: dict[str, dict[str, float]] = {
    "sigkill": {},
    # Stopped longer than the RaaS session timeout (10 s) the node is a zombie: the group
    # has moved its partitions on, and whatever it sends when it wakes must be fenced.
    "sigstop": {"resume_after_s": 15.0},
    # A slow node: SIGSTOP/SIGCONT in a duty cycle, stopped ``stopped_frac`` of each period.
    "slow_node": {"duration_s": 20.0, "period_s": 2.0, "stopped_frac": 0.5},
    # Cut from the broker by the runner's Toxiproxy path (faults.CutLink); every connection dropped on restore.
    "partition": {"duration_s": 15.0},
}
#: Faults on the Kafka cluster itself.
BROKER_KINDS: dict[str, dict[str, float | None]] = {
    "broker_restart": {"down_s": 3.0},  # SIGKILL, then the same node on the same data dir
    "broker_loss": {"restart_after_s": None},  # 3 brokers: one SIGKILLed; None: it stays dead
    "disk_full": {"duration_s": 10.0},  # the broker's data dir (a tmpfs) filled to the last byte
}
#: A deliberately broken component (proof that the audit can fail): a rogue writer that
#: appends a copy of the newest batch as the next step, as a dataflow sending twice would.
ROGUE_KINDS: dict[str, dict[str, float]] = {"rogue_batch": {}}
KINDS = {**PROCESS_KINDS, **BROKER_KINDS, **ROGUE_KINDS}
#: Kinds a ``random`` schedule may draw: each leaves the job able to finish on its own.
RANDOM_KINDS = ("sigkill", "sigstop", "slow_node", "partition", "broker_restart")

#: Process targets: a role (one of its nodes, drawn with the seed) or a node id.
ROLE_TARGETS = ("raas", "trainer", "dataflow")
#: The evaluator is an actor inside the dataflow process: a fault on it is one on the dataflow.
ALIASES = {"evaluator": "dataflow"}
_RAAS_NODE = re.compile(r"raas-(\d+)")

_TOP_KEYS = ("job", "brokers", "seed", "duration_s", "timeout_s", "restart", "settle_s", "faults", "name")
_JOB_KEYS = ("config", "set")
_RESTART_KEYS = ("delay_s", "max")
_RANDOM_KEYS = ("every_s", "kinds", "targets", "start_s", "jitter", "params")


class ScenarioError(FatalError, ValueError):
    """An invalid scenario; names the file and the key, like a job config's ConfigError."""

    def __init__(self, file: str, key: str, problem: str) -> None:
        self.file, self.key, self.problem = file, key, problem
        super().__init__(f"{file}: {key}: {problem}")


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: when (``at_s`` or ``at_step``), what (``kind``), on whom (``target``)."""

    kind: str
    at_s: float | None = None  #: seconds after the job's components started
    at_step: int | None = None  #: once the trainer has trained this many steps
    target: str = ""  #: process kinds: role or node id; broker kinds: "leader", "any" or a node id
    params: dict[str, Any] = field(default_factory=dict)  #: the kind's parameters, defaults filled in
    key: str = ""  #: where it came from in the file (``faults[2]``), for messages

    @property
    def when(self) -> str:
        return f"step {self.at_step}" if self.at_step is not None else f"{self.at_s:g}s"


@dataclass(frozen=True)
class RandomFaults:
    """Faults drawn with the scenario's seed: one every ``every_s`` (+- ``jitter`` of it)."""

    every_s: float
    kinds: tuple[str, ...]
    targets: tuple[str, ...]  #: process targets the process kinds draw from
    start_s: float  #: the first one, after the components started
    jitter: float = 0.25
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  #: per kind, defaults filled in


@dataclass(frozen=True)
class Restart:
    """The runner's supervisor: a dead component comes back after ``delay_s``."""

    delay_s: float = 2.0
    max: int = 10  #: restarts of one component after crashes the runner did not inject


@dataclass(frozen=True)
class Scenario:
    name: str
    path: Path
    job_config: Path  #: the job config, resolved against the scenario's folder
    overrides: dict[str, Any]  #: dotted job-config keys (``trainer.steps``) to values
    brokers: int = 1
    seed: int = 0
    duration_s: float | None = None  #: the fault window; None: faults until the job completes
    timeout_s: float = 1800.0  #: the whole run, faults and recovery included
    settle_s: float = 180.0  #: after the job: for the audit to settle and nodes to reach the final weights
    restart: Restart = Restart()
    faults: tuple[Fault, ...] = ()
    random: RandomFaults | None = None

    def set_args(self) -> list[str]:
        """The overrides as ``--set KEY=VALUE`` arguments (values in YAML flow style)."""
        return [f"{k}={_flow(v)}" for k, v in self.overrides.items()]


def _flow(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text[:-4].strip() if text.endswith("\n...") or text.endswith(" ...") else text


def load_scenario(path: str | Path) -> Scenario:
    """Read and check a scenario file (not yet against its job: see :func:`check_against_job`)."""
    path = Path(path)
    file = str(path)
    data = load_yaml(path, "a mapping (job, faults, ...)", ScenarioError)  # job configs' strict loader
    _only(file, "", data, _TOP_KEYS)
    name = str(data.get("name") or path.stem)
    if check_name(name):  # the run dir is named after it
        raise ScenarioError(file, "name", check_name(name))
    if "job" not in data:
        raise ScenarioError(file, "job", "required key is missing (the job config, relative to this file)")
    job_config, overrides = _job(file, path, data["job"])
    brokers = data.get("brokers", 1)
    if brokers not in (1, 3):
        raise ScenarioError(file, "brokers", f"must be 1 or 3, got {brokers!r}")
    restart = _restart(file, data.get("restart", {}))
    faults, rnd = _faults(file, data.get("faults", []))
    sc = Scenario(name=name, path=path, job_config=job_config, overrides=overrides,
                  brokers=brokers, seed=_int(file, "seed", data.get("seed", 0)),
                  duration_s=None if data.get("duration_s") is None else _pos(file, "duration_s", data["duration_s"]),
                  timeout_s=_pos(file, "timeout_s", data.get("timeout_s", 1800.0)),
                  settle_s=_pos(file, "settle_s", data.get("settle_s", 180.0)),
                  restart=restart, faults=faults, random=rnd)
    _check_cluster(sc)
    return sc


def check_against_job(sc: Scenario, raas_nodes: int) -> None:
    """Named RaaS targets must exist in the job (``rollout.nodes`` of them: raas-0 ...)."""
    named = [(f.key + ".target", f.target) for f in sc.faults]
    if sc.random:
        named += [(f"faults.random.targets[{i}]", t) for i, t in enumerate(sc.random.targets)]
    for key, target in named:
        m = _RAAS_NODE.fullmatch(target)
        if m and int(m.group(1)) >= raas_nodes:
            raise ScenarioError(str(sc.path), key, f"{target} does not exist: the job runs {raas_nodes} RaaS "
                                                   f"node(s), raas-0 .. raas-{raas_nodes - 1} (rollout.nodes)")


# -- sections -----------------------------------------------------------------------------

def _job(file: str, path: Path, value: Any) -> tuple[Path, dict[str, Any]]:
    if isinstance(value, str):
        value = {"config": value}
    if not isinstance(value, dict):
        raise ScenarioError(file, "job", "expected a path or a mapping {config: PATH, set: {KEY: VALUE}}")
    _only(file, "job.", value, _JOB_KEYS)
    if not isinstance(value.get("config"), str):
        raise ScenarioError(file, "job.config", "required: the job config's path, relative to this file")
    config = (path.parent / value["config"]).resolve()
    if not config.is_file():
        raise ScenarioError(file, "job.config", f"no such file: {config}")
    overrides = value.get("set") or {}
    if not isinstance(overrides, dict) or not all(isinstance(k, str) for k in overrides):
        raise ScenarioError(file, "job.set", "expected a mapping of dotted job-config keys to values")
    for k in overrides:
        if k in ("job", "run_dir"):
            raise ScenarioError(file, f"job.set.{k}", "set by the runner (each run gets its own job and run dir)")
    return config, dict(overrides)


def _restart(file: str, value: Any) -> Restart:
    if not isinstance(value, dict):
        raise ScenarioError(file, "restart", "expected a mapping {delay_s, max}")
    _only(file, "restart.", value, _RESTART_KEYS)
    return Restart(delay_s=_num(file, "restart.delay_s", value.get("delay_s", 2.0)),
                   max=_int(file, "restart.max", value.get("max", 10)))


def _faults(file: str, value: Any) -> tuple[tuple[Fault, ...], RandomFaults | None]:
    if not isinstance(value, list):
        raise ScenarioError(file, "faults", "expected a list of faults")
    faults, rnd = [], None
    for i, entry in enumerate(value):
        key = f"faults[{i}]"
        if not isinstance(entry, dict):
            raise ScenarioError(file, key, "expected a mapping (at_s or at_step, kind, target, ...) or {random: ...}")
        if "random" in entry:
            if len(entry) != 1:
                raise ScenarioError(file, key, f"a random entry holds only 'random', got {sorted(entry)}")
            if rnd is not None:
                raise ScenarioError(file, key, "only one random schedule per scenario")
            rnd = _random(file, f"{key}.random", entry["random"])
        else:
            faults.append(_fault(file, key, entry))
    return tuple(faults), rnd


def _fault(file: str, key: str, entry: dict) -> Fault:
    kind = entry.get("kind")
    if kind not in KINDS:
        raise ScenarioError(file, f"{key}.kind", f"unknown fault kind {kind!r} (known: {', '.join(KINDS)})")
    defaults = KINDS[kind]
    allowed = ("kind", "at_s", "at_step", "target", *defaults)
    _only(file, f"{key}.", entry, allowed)
    if ("at_s" in entry) == ("at_step" in entry):
        raise ScenarioError(file, key, "give exactly one of at_s (seconds after start) and at_step (a trainer step)")
    at_s = _num(file, f"{key}.at_s", entry["at_s"]) if "at_s" in entry else None
    at_step = _int(file, f"{key}.at_step", entry["at_step"]) if "at_step" in entry else None
    target = _target(file, f"{key}.target", kind, entry.get("target"))
    return Fault(kind, at_s, at_step, target, _params(file, key, kind, entry), key)


def _random(file: str, key: str, value: Any) -> RandomFaults:
    if not isinstance(value, dict):
        raise ScenarioError(file, key, "expected a mapping {every_s, kinds, targets}")
    _only(file, f"{key}.", value, _RANDOM_KEYS)
    every = _pos(file, f"{key}.every_s", value.get("every_s"))
    kinds = value.get("kinds") or list(RANDOM_KINDS)
    if not isinstance(kinds, list):
        raise ScenarioError(file, f"{key}.kinds", "expected a list of fault kinds")
    for i, k in enumerate(kinds):
        if k not in RANDOM_KINDS:
            why = "unknown kind" if k not in KINDS else "not drawn at random (schedule it at a time or step)"
            raise ScenarioError(file, f"{key}.kinds[{i}]", f"{why}: {k!r} (random kinds: {', '.join(RANDOM_KINDS)})")
    targets = value.get("targets") or ["raas"]
    if not isinstance(targets, list):
        raise ScenarioError(file, f"{key}.targets", "expected a list of process targets")
    targets = [_process_target(file, f"{key}.targets[{i}]", t) for i, t in enumerate(targets)]
    params = value.get("params") or {}
    if not isinstance(params, dict):
        raise ScenarioError(file, f"{key}.params", "expected a mapping of kind -> its parameters")
    filled = {}
    for k in kinds:
        given = params.get(k) or {}
        if not isinstance(given, dict):
            raise ScenarioError(file, f"{key}.params.{k}", "expected a mapping of the kind's parameters")
        _only(file, f"{key}.params.{k}.", given, tuple(KINDS[k]))
        filled[k] = _params(file, f"{key}.params.{k}", k, given)
    for k in params:
        if k not in kinds:
            raise ScenarioError(file, f"{key}.params.{k}", f"parameters for a kind not in kinds ({', '.join(kinds)})")
    jitter = _num(file, f"{key}.jitter", value.get("jitter", 0.25))
    if not 0 <= jitter < 1:
        raise ScenarioError(file, f"{key}.jitter", f"a fraction of every_s in [0, 1), got {jitter}")
    return RandomFaults(every, tuple(kinds), tuple(targets),
                        _num(file, f"{key}.start_s", value.get("start_s", every)), jitter, filled)


def _params(file: str, key: str, kind: str, entry: dict) -> dict[str, Any]:
    out = {}
    for name, default in KINDS[kind].items():
        v = entry.get(name, default)
        out[name] = None if v is None else _pos(file, f"{key}.{name}", v)
    if kind == "slow_node" and not 0 < out["stopped_frac"] < 1:
        raise ScenarioError(file, f"{key}.stopped_frac", f"a fraction in (0, 1), got {out['stopped_frac']}")
    return out


#: Named broker targets: the leader of batches.<policy>'s partition 0, the group coordinator of
#: the RaaS nodes' task group, the transaction coordinator of raas-0's transactional id, a drawn one.
BROKER_TARGETS = ("leader", "coordinator", "txn_coordinator", "any")


def _target(file: str, key: str, kind: str, value: Any) -> str:
    if kind in PROCESS_KINDS:
        if value is None:
            raise ScenarioError(file, key, f"{kind} needs a target: one of {', '.join(ROLE_TARGETS)}, a node id "
                                           f"(raas-0, ...) or evaluator (the dataflow process)")
        return _process_target(file, key, value)
    if kind in ("broker_restart", "broker_loss"):
        value = "leader" if value is None else value
        if value in BROKER_TARGETS or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return str(value)
        raise ScenarioError(file, key, f"a broker target is 'leader' (of batches), 'coordinator' (of the RaaS "
                                       f"nodes' group), 'txn_coordinator' (of raas-0's transactions), 'any' or a "
                                       f"node id >= 1, got {value!r}")
    if value is not None:
        raise ScenarioError(file, key, f"{kind} takes no target")
    return ""


def _process_target(file: str, key: str, value: Any) -> str:
    value = ALIASES.get(value, value) if isinstance(value, str) else value
    if not isinstance(value, str) or not (value in ROLE_TARGETS or _RAAS_NODE.fullmatch(value)):
        raise ScenarioError(file, key, f"unknown target {value!r}: one of {', '.join(ROLE_TARGETS)}, a RaaS node "
                                       f"id (raas-0, raas-1, ...) or evaluator (it lives in the dataflow process)")
    return value


def _check_cluster(sc: Scenario) -> None:
    file = str(sc.path)
    kinds = [(f.key, f.kind, f) for f in sc.faults]
    if sc.random:
        kinds += [(f"faults.random.kinds[{i}]", k, None) for i, k in enumerate(sc.random.kinds)]
    for key, kind, fault in kinds:
        if kind == "broker_loss" and sc.brokers != 3:
            raise ScenarioError(file, key, "broker_loss needs brokers: 3 (a single broker's loss is broker_restart)")
        if kind in ("partition", "disk_full") and sc.brokers != 1:
            raise ScenarioError(file, key, f"{kind} is implemented for brokers: 1 only")
        if fault is not None and fault.target.isdigit() and int(fault.target) > sc.brokers:
            raise ScenarioError(file, f"{key}.target", f"no broker {fault.target}: the scenario runs {sc.brokers}")
    losses = [k for k, kind, _ in kinds if kind == "broker_loss"]
    if len(losses) > 1:
        raise ScenarioError(file, losses[1], "a 3-broker cluster survives one broker loss, not two")


# -- scalars ------------------------------------------------------------------------------

def _only(file: str, prefix: str, data: dict, allowed: tuple[str, ...]) -> None:
    for k in data:
        if k not in allowed:
            raise ScenarioError(file, f"{prefix}{k}", f"unknown key (allowed here: {', '.join(allowed)})")


def _num(file: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(file, key, f"expected a number, got {value!r}")
    if not abs(value) < 1e15:  # also nan and inf
        raise ScenarioError(file, key, f"must be a finite number below 1e15, got {value!r:.40}")
    if value < 0:
        raise ScenarioError(file, key, f"must be >= 0, got {value}")
    return float(value)


def _pos(file: str, key: str, value: Any) -> float:
    v = _num(file, key, value)
    if v <= 0:
        raise ScenarioError(file, key, f"must be > 0, got {value}")
    return v


def _int(file: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScenarioError(file, key, f"expected a non-negative integer, got {value!r}")
    return value
