"""Topology files: the one description of a deployment, as typed YAML.

A topology names its **regions**; each region has a Kafka cluster (``embedded``, bootstrap
servers, or ``region:<name>`` for the cluster of another region), **hosts**, and **pools**:
a component (dataflow / trainer of a policy / RaaS of a policy), how many nodes, where
they run, the device kind and count of one node, its relative speed and cost per
device-hour, and for RaaS pools the ``min``/``max`` the autoscaler keeps to. **Links**
between regions carry bandwidth and latency (used for placement, and emulated by
``astraflow launch`` unless ``emulate_links: false``); the **autoscaler** section turns elastic
RaaS pools over to the autoscaler actor and chooses its actuator backend; **slurm** names the
Slurm cluster a run or the autoscaler submits to, and each pool's ``slurm`` what one of its
nodes asks for there.

This module holds the shapes and per-field checks only; cross-references (hosts of a pool,
regions of a link, one trainer per policy, ...) are :mod:`.validation`'s, and what runs
where is :mod:`.plan`'s. It knows nothing about processes or Kafka clients. Files load
strictly, like job configs (:func:`~.validation.load_topology`: these shapes, then the
cross-checks): an unknown key or a wrong type is a
:class:`~astraflow.config.ConfigError` naming the file and the dotted key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from astraflow.config import ClusterSecurityConfig
from astraflow.typed_config import Bounds, ConfigError, from_dict
from astraflow.typed_config import setting as _k

COMPONENTS = ("dataflow", "trainer", "raas")
EMBEDDED = "embedded"
REGION_REF = "region:"


class TopologyError(ConfigError):
    """An invalid topology file; names the file and the dotted key."""


PERIOD_S = Bounds(0, 86_400, lo_open=True)
SHARE = Bounds(0, 1)


@dataclass(frozen=True)
class Device:
    kind: str = _k("cpu", "device kind of one node (h100, a10, cpu, ...): the label device-hours are counted under")
    count: int = _k(1, "devices one node holds", bounds=Bounds(0, 100_000))
    emulate: str | None = _k(None, "run the node on CPU as this emulated device: a profile of emulation/profiles.yaml "
                                   "(e.g. h100-qwen3-8b) whose cost model holds each call for its modelled time")
    slowdown: float = _k(1.0, "run the node on CPU as a device kind this many times slower than it: each call held "
                              "for slowdown x its own time; 1 = off", bounds=Bounds(1, 1e6))
    dilation: float = _k(1.0, "with emulate: wall seconds per modelled second", bounds=Bounds(0, 1e6, lo_open=True))
    token_scale: int = _k(1, "with emulate: modelled tokens per real generated token", bounds=Bounds(1, 10**6))
    prompt_token_scale: int = _k(0, "with emulate: modelled tokens per real prompt token (0: token_scale)",
                                 bounds=Bounds(0, 10**6))
    workload: str = _k("", "with emulate: a workload of emulation/profiles.yaml whose response-length spread the "
                           "modelled lengths take (e.g. reasoning)")

    def __post_init__(self) -> None:
        if not self.kind.strip():
            raise ValueError("device.kind is empty")
        if self.count < 0:
            raise ValueError(f"device.count must be >= 0, got {self.count}")
        if self.emulated:
            self.device_config()  # the job config's device section checks the rest (profile names, bounds)
        elif self.dilation != 1.0 or self.token_scale != 1 or self.prompt_token_scale or self.workload:
            raise ValueError("device.dilation, device.token_scale, device.prompt_token_scale and device.workload apply "
                             "to an emulated device (emulate: PROFILE)")

    @property
    def emulated(self) -> bool:
        return self.emulate is not None or self.slowdown != 1.0

    def device_config(self):
        """The job config's ``device`` section a node of this device gets (``kind: cpu`` if not emulated)."""
        from astraflow.emulation import DeviceConfig
        if not self.emulated:
            return DeviceConfig()
        return DeviceConfig(kind="emulated", profile=self.emulate or "", slowdown=self.slowdown,
                            count=max(1, self.count), dilation=self.dilation, token_scale=self.token_scale,
                            prompt_token_scale=self.prompt_token_scale, workload=self.workload)


@dataclass(frozen=True)
class Host:
    address: str = _k("127.0.0.1", "address the other hosts reach this one at (a trainer group's master address)")


#: Slurm's time formats (``--time``): minutes, m:s, h:m:s, d-h, d-h:m, d-h:m:s, or no limit.
SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|UNLIMITED|INFINITE")
SLURM_MEM = re.compile(r"\d+[KMGT]?")
#: sbatch flags the Slurm backend sets itself: a pool's ``slurm.extra`` may not.
SLURM_OWN_FLAGS = ("--job-name", "--output", "--error", "--wrap", "--parsable", "--open-mode", "--chdir", "-J", "-o",
                   "-e", "-D")


def _check_slurm_common(partition: str | None, time_limit: str | None) -> None:
    if partition is not None and not partition.strip():
        raise ValueError("partition is empty (null: the cluster's default)")
    if time_limit is not None and not SLURM_TIME.fullmatch(time_limit):
        raise ValueError(f"time_limit {time_limit!r} is not a Slurm time (minutes, h:m:s, d-h:m:s, UNLIMITED)")


@dataclass(frozen=True)
class SlurmResources:
    """What ``sbatch`` asks for one node of a pool (``launch --backend slurm``, ``autoscaler.backend: slurm``)."""

    cpus: int | None = _k(None, "--cpus-per-task (null: the pool's threads, else 1)", bounds=Bounds(1, 100_000))
    gpus: int | None = _k(None, "--gres=gpu:N (null: device.count when device.kind is not cpu and the device is not "
                                "emulated, else none)", bounds=Bounds(0, 100_000))
    mem: str | None = _k(None, "--mem, Slurm's form: 8G, 500M (null: the partition's default)")
    partition: str | None = _k(None, "--partition (null: slurm.partition)")
    time_limit: str | None = _k(None, "--time, Slurm's form: 30, 2:00:00, 1-12 (null: slurm.time_limit)")
    extra: tuple[str, ...] = _k((), "further sbatch flags, each one word: --account=A, --qos=Q, --constraint=C, "
                                    "--nodelist=N")

    def __post_init__(self) -> None:
        _check_slurm_common(self.partition, self.time_limit)
        if self.mem is not None and not SLURM_MEM.fullmatch(self.mem):
            raise ValueError(f"mem {self.mem!r} is not a Slurm size (a number with K, M, G or T)")
        for flag in self.extra:
            if not flag.startswith("-"):
                raise ValueError(f"extra: {flag!r} is not a flag (one word each: --account=A)")
            if flag.split("=")[0] in SLURM_OWN_FLAGS:
                raise ValueError(f"extra: {flag.split('=')[0]} is set by the Slurm backend itself")


@dataclass(frozen=True)
class SlurmSpec:
    """The Slurm cluster ``launch --backend slurm`` and ``autoscaler.backend: slurm`` submit to."""

    conf: str | None = _k(None, "its slurm.conf, given to the commands as SLURM_CONF (relative: to this file's "
                                "folder; null: $SLURM_CONF, else Slurm's own default)")
    bin_dir: str | None = _k(None, "the folder of sbatch, squeue, scancel and scontrol (null: "
                                   "$ASTRAFLOW_SLURM_BIN, else PATH)")
    partition: str | None = _k(None, "--partition of every node whose pool names none (null: the cluster's default)")
    time_limit: str | None = _k(None, "--time of every node whose pool names none (null: the partition's)")
    poll_s: float = _k(2.0, "squeue is asked at most this often for the state of the run's jobs",
                       bounds=Bounds(0.1, 600))

    def __post_init__(self) -> None:
        _check_slurm_common(self.partition, self.time_limit)


@dataclass(frozen=True)
class Pool:
    component: Literal["dataflow", "trainer", "raas"] = _k(help="what its nodes run")
    hosts: tuple[str, ...] = _k(help="hosts of its region its nodes run on, round-robin")
    policy: str | None = _k(None, "trainer/raas: the policy served (null: the job's policy)")
    count: int = _k(1, "nodes started at launch (a trainer: hosts of its rank group, one agent each)",
                    bounds=Bounds(0, 10_000))
    min: int | None = _k(None, "raas: fewest nodes the autoscaler keeps (null: count)", bounds=Bounds(0, 10_000))
    max: int | None = _k(None, "raas: most nodes the autoscaler starts (null: count); min < max makes it elastic",
                         bounds=Bounds(0, 10_000))
    device: Device = _k(Device(), "the devices of one node")
    speed: float | None = _k(None, "relative throughput of one node (null: 1 / device.slowdown); guides placement",
                             bounds=Bounds(0, 1e6, lo_open=True))
    cost_per_device_hour: float = _k(0.0, "price of one device for an hour; device-hours x this = cost",
                                     bounds=Bounds(0, 1e6))
    threads: int | None = _k(None, "torch threads per node (null: the job config's)", bounds=Bounds(1, 1024))
    master_port: int | None = _k(None, "trainer on several hosts: host 0's rendezvous port", bounds=Bounds(1, 65_535))
    slurm: SlurmResources = _k(SlurmResources(), "what sbatch asks for one node on Slurm")

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ValueError("hosts is empty; name at least one host of the region")
        if self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count}")
        if self.speed is not None and self.speed <= 0:
            raise ValueError(f"speed must be > 0, got {self.speed}")
        if self.cost_per_device_hour < 0:
            raise ValueError(f"cost_per_device_hour must be >= 0, got {self.cost_per_device_hour}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    @property
    def lo(self) -> int:
        return self.count if self.min is None else self.min

    @property
    def hi(self) -> int:
        return self.count if self.max is None else self.max

    @property
    def elastic(self) -> bool:
        return self.lo < self.hi

    @property
    def node_speed(self) -> float:
        return self.speed if self.speed is not None else 1.0 / self.device.slowdown


@dataclass(frozen=True)
class Region:
    hosts: dict[str, Host] = _k(help="host name -> {address}; a list of names is accepted too")
    pools: dict[str, Pool] = _k(help="pool name -> pool; node ids are <pool>-<i> (a dataflow/trainer: the pool name)")
    kafka: str = _k(EMBEDDED, "'embedded' (a broker `astraflow launch` starts: in the dataflow's region the home "
                              "cluster, in another region a cluster of the region's own, inside its namespace, "
                              "that MirrorMaker 2 copies weights.<policy> and versions into from home), bootstrap "
                              "servers 'host:port,...' (an existing cluster: in a remote region, mirrored from "
                              "home like an embedded one; on hosts by `astraflow mirror --region`), or 'region:<name>' (the cluster of that region; "
                              "'region:<home>' is direct mode: the region's nodes use the home cluster over the "
                              "link)")
    kafka_security: ClusterSecurityConfig | None = _k(None, "with kafka naming an existing cluster: how clients (its "
                                                      "MirrorMaker 2, the mirror command's) authenticate to it (SASL, "
                                                      "TLS); null: the job's kafka.security, like its other clients")


@dataclass(frozen=True)
class Link:
    between: tuple[str, str] = _k(help="the two regions it joins")
    bandwidth_mbps: float = _k(help="bandwidth, Mbit/s", bounds=Bounds(0, 1e9, lo_open=True))
    latency_ms: float = _k(0.0, "one-way latency, ms", bounds=Bounds(0, 1e6))

    def __post_init__(self) -> None:
        if self.bandwidth_mbps <= 0:
            raise ValueError(f"bandwidth_mbps must be > 0, got {self.bandwidth_mbps}")
        if self.latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")


@dataclass(frozen=True)
class CommandTemplates:
    start: str = _k(help="command that starts a RaaS node: {cmd} (the node's command line, shell-quoted), "
                         "{node_id}, {pool}, {policy}, {host}, {address}, {region}, {job}")
    stop: str = _k(help="command that retires one: it must send the node SIGTERM (it finishes its in-flight "
                        "tasks and leaves the consumer group); same placeholders")


@dataclass(frozen=True)
class KubernetesSpec:
    namespace: str = _k("default", "namespace of the release's RaaS Deployments")
    release: str | None = _k(None, "the Helm release's name, filling {release} in deployment")
    deployment: str = _k("{release}-astraflow-raas-{pool}", "a pool's Deployment: {pool} is its topology name, "
                                                            "{release} the release (the chart's name; it cuts "
                                                            "<release>-astraflow to 52 characters)")
    kubeconfig: str | None = _k(None, "kubeconfig file, relative to the topology's folder (null: the pod's service "
                                      "account in a cluster, else $KUBECONFIG or ~/.kube/config)")
    context: str | None = _k(None, "the kubeconfig's context (null: its current one)")
    start_timeout_s: float = _k(120.0, "a scale-up whose pod the controller has not created by then is undone",
                                bounds=PERIOD_S)

    def __post_init__(self) -> None:
        if "{pool}" not in self.deployment:
            raise ValueError(f"deployment must contain {{pool}} (one Deployment per pool), got {self.deployment!r}")
        try:
            self.deployment.format(pool="p", release="r")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"deployment {self.deployment!r}: only {{pool}} and {{release}} can be filled in ({e})") \
                from None
        if "{release}" in self.deployment and not self.release:
            raise ValueError("deployment names {release}: set release (the Helm release's name)")


@dataclass(frozen=True)
class AutoscalerSpec:
    enabled: bool = _k(False, "true: the autoscaler starts and retires the nodes of elastic pools (min < max)")
    host: str | None = _k(None, "host it runs on under `astraflow node --topology` (null: the trainer's)")
    backend: Literal["local", "command", "kubernetes", "slurm"] = _k(
        "local", "local: node processes on its own host; command: the command templates (e.g. a cluster "
                 "scheduler's CLI); kubernetes: scale the pools' Deployments of the Helm chart; slurm: a Slurm job "
                 "per node (sbatch, scancel; see slurm)")
    command: CommandTemplates | None = _k(None, "backend command: the start/stop templates")
    kubernetes: KubernetesSpec | None = _k(None, "backend kubernetes: where the pools' Deployments are")
    interval_s: float = _k(5.0, "seconds between decisions", bounds=PERIOD_S)
    window_s: float = _k(60.0, "the trainer wait fraction and the pool's busy time are measured over this window",
                         bounds=PERIOD_S)
    cooldown_s: float = _k(60.0, "no action within this long of the previous one (new nodes must load first)",
                           bounds=Bounds(0, 86_400))
    scale_up_wait: float = _k(0.10, "wait fraction w above this: target = ceil(G / (1 - w))", bounds=SHARE)
    scale_down_wait: float = _k(0.05, "w below this: shrink towards the demand consumed (busy node-equivalents)",
                                bounds=SHARE)
    scale_up_busy: float = _k(0.6, "grow only while the pool is at least this busy (busy time / nodes): a trainer "
                                   "waiting on an idle pool waits for latency, not capacity", bounds=SHARE)
    confirm: int = _k(2, "consecutive decisions that must agree before acting (hysteresis)", bounds=Bounds(1, 1000))
    target_utilization: float = _k(0.8, "shrinking keeps busy time / pool size at most this",
                                   bounds=Bounds(0, 1, lo_open=True))
    retire_timeout_s: float = _k(120.0, "a retired node still running after this long is killed (its tasks are "
                                        "redelivered; slurm: scancel --signal=TERM, then scancel)", bounds=PERIOD_S)

    def __post_init__(self) -> None:
        if self.backend == "command" and self.command is None:
            raise ValueError("backend 'command' needs command: {start: ..., stop: ...}")
        if (self.backend == "kubernetes") != (self.kubernetes is not None):
            raise ValueError("backend 'kubernetes' needs kubernetes: {namespace: ..., release: ...}, and only it")
        if not 0 <= self.scale_down_wait < self.scale_up_wait < 1:
            raise ValueError(f"need 0 <= scale_down_wait < scale_up_wait < 1 (a gap between them is the hysteresis), "
                             f"got {self.scale_down_wait} and {self.scale_up_wait}")
        for key in ("interval_s", "window_s", "retire_timeout_s"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)}")
        if self.cooldown_s < 0:
            raise ValueError(f"cooldown_s must be >= 0, got {self.cooldown_s}")
        if self.confirm < 1:
            raise ValueError(f"confirm must be >= 1, got {self.confirm}")
        if not 0 <= self.scale_up_busy <= 1:
            raise ValueError(f"scale_up_busy must be in [0, 1], got {self.scale_up_busy}")
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {self.target_utilization}")


@dataclass(frozen=True)
class Topology:
    name: str = _k(help="deployment name")
    regions: dict[str, Region] = _k(help="region name -> region")
    links: tuple[Link, ...] = _k((), "links between regions")
    emulate_links: bool = _k(True, "`astraflow launch` with the embedded broker: nodes of a region other than the "
                                   "Kafka cluster's reach the broker through a loopback proxy that adds their "
                                   "link's latency and caps its bandwidth; false: they connect directly")
    autoscaler: AutoscalerSpec = _k(AutoscalerSpec(), "the elastic autoscaler")
    slurm: SlurmSpec = _k(SlurmSpec(), "the Slurm cluster of `launch --backend slurm` and autoscaler.backend: slurm")
    source: str = field(default="<dict>", compare=False, metadata={"help": "file it was loaded from"})


def parse_topology(data: dict, file: str = "<dict>") -> Topology:
    """Plain data -> :class:`Topology`, per-field checks only."""
    data = dict(data)
    for rname, region in (data.get("regions") or {}).items():
        if isinstance(region, dict) and isinstance(region.get("hosts"), list):
            region = dict(region, hosts={h: {} for h in region["hosts"]})
        if isinstance(region, dict) and isinstance(region.get("hosts"), dict):
            region = dict(region, hosts={h: ({} if v is None else v) for h, v in region["hosts"].items()})
        data["regions"] = {**data["regions"], rname: region}
    try:
        return from_dict(Topology, {**data, "source": file}, file)
    except ConfigError as e:
        raise TopologyError(e.file, e.key, e.problem) from None
