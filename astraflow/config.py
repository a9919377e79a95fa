"""Job configuration: typed sections, loaded from YAML and validated at load time.

Every section is a frozen dataclass whose fields carry ``metadata={"help": ...}``.
:func:`load_config` is strict (the shared loader, :mod:`astraflow.typed_config`): an
unknown key, a missing required key or a value of the wrong type raises
:class:`ConfigError` naming the dotted key and the file. Beyond the types it checks what
spans sections: data-algorithm pipelines, workflow and role bindings, topic-safe names.
The components read it; it sits above the engines, workflows and algorithms whose
settings and names it validates, and below the actors.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from astraflow.algorithms.registry import AlgorithmSpec
from astraflow.emulation.device import DeviceConfig
from astraflow.engines.config import RolloutConfig as EngineRolloutConfig
from astraflow.engines.config import TrainerConfig as EngineTrainerConfig
from astraflow.typed_config import Bounds, ConfigError, check_name, from_dict, load_yaml


def _f(default: Any = dataclasses.MISSING, help: str = "", bounds: Bounds | None = None,  # noqa: A002
       **kw: Any) -> Any:
    meta = {"help": help, **({"bounds": bounds} if bounds else {})}
    if isinstance(default, (dict, list)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


#: Bounds shared by many keys: seeds (what numpy and torch both take), niceness increments.
SEED = Bounds(0, 2**32 - 1)
NICE = Bounds(0, 19)
GENERATORS = ("arithmetic", "code", "text_game", "search")  #: data sources that generate prompts (and their own held-out split)


@dataclass(frozen=True)
class RetentionLimit:
    ms: int | None = _f(None, "retention.ms of the family's topics: records older than this are deleted (-1: "
                              "never; null: the project's default; else at least 60000)",
                 bounds=Bounds(-1, 2**62, why="-1 or at least 60000"))
    bytes: int | None = _f(None, "retention.bytes per partition of the family's topics: the oldest segments go "
                                 "beyond it (-1: unbounded; null: the project's default; else at least 1 MiB)",
                    bounds=Bounds(-1, 2**62, why="-1 or at least 1048576"))  # noqa: A003


#: The smallest limits accepted: below them a running job would lose what it still reads.
_MIN_RETENTION_MS, _MIN_RETENTION_BYTES = 60_000, 1024 * 1024


@dataclass(frozen=True)
class RetentionConfig:
    """Broker-side retention per topic family (docs/run-dir.md). Bounding ``tasks``,
    ``trajectories``, ``batches`` or ``prompts`` below a job's length loses records the
    running job, its audit, ``replay`` and ``export`` still read; ``metrics`` and
    ``control`` are the safe ones to bound. ``weights.<policy>`` is trimmed by its publisher."""

    prompts: RetentionLimit = _f(RetentionLimit(), "the input stream (default: kept forever)")
    tasks: RetentionLimit = _f(RetentionLimit(), "tasks.<policy> (default: kept forever)")
    trajectories: RetentionLimit = _f(RetentionLimit(), "trajectory groups (default: kept forever)")
    batches: RetentionLimit = _f(RetentionLimit(), "batches.<policy>, the record replay retrains from (default: "
                                                   "kept forever)")
    drops: RetentionLimit = _f(RetentionLimit(), "drops.<policy> (default: kept forever)")
    metrics: RetentionLimit = _f(RetentionLimit(), "metric events (default: 7 days)")
    control: RetentionLimit = _f(RetentionLimit(), "heartbeats and control records (default: 1 hour)")
    dlq: RetentionLimit = _f(RetentionLimit(), "the dead-letter topic (default: kept forever)")

    def __post_init__(self) -> None:
        for family in self.limits():
            lim = getattr(self, family)
            if lim.ms is not None and lim.ms != -1 and lim.ms < _MIN_RETENTION_MS:
                raise ValueError(f"kafka.retention.{family}.ms must be -1 (never delete) or >= {_MIN_RETENTION_MS} "
                                 f"(one minute), got {lim.ms}")
            if lim.bytes is not None and lim.bytes != -1 and lim.bytes < _MIN_RETENTION_BYTES:
                raise ValueError(f"kafka.retention.{family}.bytes must be -1 (unbounded) or >= "
                                 f"{_MIN_RETENTION_BYTES} (1 MiB), got {lim.bytes}")

    def limits(self) -> dict[str, tuple[int | None, int | None]]:
        """``{family: (ms, bytes)}`` of the families given a limit (the topics layer's view)."""
        out = {}
        for f in dataclasses.fields(self):
            lim = getattr(self, f.name)
            if lim.ms is not None or lim.bytes is not None:
                out[f.name] = (lim.ms, lim.bytes)
        return out


#: The component roles a job's principals are named for (``kafka.security.principals``, ``astraflow acl``).
PRINCIPAL_ROLES = ("raas", "trainer", "dataflow", "admin")
#: The roles whose nodes serve one policy: ``principals`` may name ``<role>.<policy>`` for them.
POLICY_ROLES = ("raas", "trainer")


def principal_role(key: str) -> tuple[str, str | None]:
    """``"trainer.solver"`` -> ``("trainer", "solver")``; ``"raas"`` -> ``("raas", None)``."""
    role, _, policy = key.partition(".")
    return role, policy or None


@dataclass(frozen=True)
class KafkaPrincipal:
    username: str = _f(help="the SCRAM/PLAIN user this role's processes authenticate as")
    password_file: str | None = _f(None, "a file holding its password (first line; relative to the config file)")
    password_env: str | None = _f(None, "an environment variable holding its password")

    def __post_init__(self) -> None:
        if bool(self.password_file) == bool(self.password_env):
            raise ValueError("give exactly one of password_file and password_env (the password is never inline)")


@dataclass(frozen=True)
class KafkaSecurityConfig:
    """How every Kafka client of the job authenticates (docs/security.md). Passwords are never
    in the YAML: a file or an environment variable holds each one."""

    protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"] = _f(
        "PLAINTEXT", "the listener's security protocol (SASL_SSL: TLS + a SASL login)")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = _f(
        None, "SASL mechanism of the SASL_* protocols")
    username: str | None = _f(None, "the SASL user of every role without an entry in principals")
    password_file: str | None = _f(None, "a file holding that user's password (first line; relative to the config "
                                         "file)")
    password_env: str | None = _f(None, "an environment variable holding that user's password")
    ca_file: str | None = _f(None, "PEM file of the CA(s) that signed the brokers' certificates (SSL, SASL_SSL; "
                                   "null: the system's)")
    cert_file: str | None = _f(None, "PEM client certificate (mutual TLS; with key_file)")
    key_file: str | None = _f(None, "PEM private key of cert_file")
    check_hostname: bool = _f(True, "check the broker certificate's name against the address dialled")
    principals: dict[str, KafkaPrincipal] = _f({}, "per role (raas, trainer, dataflow, admin), or per role and "
                                                   "policy (raas.<policy>, trainer.<policy>): its own user, so "
                                                   "ACLs give each only what it needs (`astraflow acl plan`)")
    embedded: bool = _f(False, "secure the embedded broker `astraflow run` starts: SASL_SSL (SCRAM-SHA-512), "
                               "ACLs per principal, a user and a password file (0600) per principal made in the "
                               "run dir's secure/; the run sets the other keys (leave them unset)")

    def __post_init__(self) -> None:
        sasl, tls = self.protocol.startswith("SASL_"), self.protocol.endswith("SSL")
        key = "kafka.security"
        if self.embedded:
            for f in dataclasses.fields(self):
                default = f.default_factory() if f.default is dataclasses.MISSING else f.default
                if f.name != "embedded" and getattr(self, f.name) != default:
                    raise ValueError(f"{key}.{f.name}: set, but {key}.embedded makes the run's own settings; drop "
                                     f"one of them")
        if sasl:
            if self.sasl_mechanism is None:
                raise ValueError(f"{key}.sasl_mechanism: {self.protocol} needs one of PLAIN, SCRAM-SHA-256, "
                                 f"SCRAM-SHA-512")
            covered = {principal_role(k)[0] for k in self.principals}  # per policy: JobConfig checks each policy
            if self.username is None and covered != set(PRINCIPAL_ROLES):
                raise ValueError(f"{key}.username: {self.protocol} needs a user (or principals for every role: "
                                 f"{', '.join(PRINCIPAL_ROLES)})")
            if self.username is not None and bool(self.password_file) == bool(self.password_env):
                raise ValueError(f"{key}.password_file: give exactly one of password_file and password_env for "
                                 f"{key}.username (the password is never inline)")
        else:
            for name in ("sasl_mechanism", "username", "password_file", "password_env"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{key}.{name}: set, but protocol {self.protocol} has no SASL login; use "
                                     f"SASL_SSL or drop it")
            if self.principals:
                raise ValueError(f"{key}.principals: set, but protocol {self.protocol} has no SASL login")
        if not tls:
            for name in ("ca_file", "cert_file", "key_file"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{key}.{name}: set, but protocol {self.protocol} has no TLS; use SSL or "
                                     f"SASL_SSL or drop it")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(f"{key}.{'key_file' if self.cert_file else 'cert_file'}: a client certificate needs "
                             f"both cert_file and key_file")
        for name in self.principals:
            role, policy = principal_role(name)
            if role not in PRINCIPAL_ROLES:
                raise ValueError(f"{key}.principals.{name}: unknown role {role!r} (roles: "
                                 f"{', '.join(PRINCIPAL_ROLES)}; per policy: {', '.join(POLICY_ROLES)})")
            if policy is not None and role not in POLICY_ROLES:
                raise ValueError(f"{key}.principals.{name}: the {role} serves every policy: name it {role!r} "
                                 f"(per policy: {', '.join(f'{r}.<policy>' for r in POLICY_ROLES)})")

    def principal_key(self, role: str, policy: str | None = None) -> str | None:
        """The ``principals`` entry ``role``'s node serving ``policy`` logs in as: ``<role>.<policy>``
        when there is one, else ``<role>``; None when neither (then ``username``)."""
        if policy is not None and role in POLICY_ROLES and f"{role}.{policy}" in self.principals:
            return f"{role}.{policy}"
        return role if role in self.principals else None

    def username_of(self, role: str, policy: str | None = None) -> str | None:
        """The user ``role``'s processes (serving ``policy``) authenticate as (None without SASL)."""
        k = self.principal_key(role, policy)
        return self.principals[k].username if k else self.username

    def check_policies(self, policies: tuple[str, ...], file: str) -> None:
        """Each ``<role>.<policy>`` names a policy of the job, and without ``username`` every
        policy of a role named only per policy has its own entry; :class:`ConfigError` naming the key."""
        for name in self.principals:
            role, policy = principal_role(name)
            if policy is not None and policy not in policies:
                raise ConfigError(file, f"kafka.security.principals.{name}",
                                  f"no policy {policy!r} (policies: {', '.join(policies)})")
        if self.username is None and self.protocol.startswith("SASL_"):
            for role in POLICY_ROLES:
                missing = [p for p in policies if self.principal_key(role, p) is None]
                if missing:
                    raise ConfigError(file, f"kafka.security.principals.{role}.{missing[0]}",
                                      f"the {role} of policy {missing[0]!r} has no principal: add it, or "
                                      f"{role!r} (every policy), or kafka.security.username")

    def client(self, role: str, config_dir: str = ".", file: str = "<dict>", policy: str | None = None):
        """The :class:`~astraflow.topics.security.ClientSecurity` of ``role``'s processes (its node
        serving ``policy``: principal ``<role>.<policy>`` when configured, else ``<role>``): its
        password read from its file or variable, relative paths taken from ``config_dir``;
        :class:`ConfigError` naming the key and ``file`` when one cannot be read."""
        from astraflow.topics.security import ClientSecurity, SecurityError, read_password

        def path(p: str | None) -> str | None:
            return None if p is None else str(Path(config_dir, p)) if not Path(p).is_absolute() else p

        k = self.principal_key(role, policy)
        p = self.principals[k] if k else None
        prefix = f"kafka.security.principals.{k}" if p else "kafka.security"
        src = p or self
        password = None
        if self.protocol.startswith("SASL_"):
            try:
                password = read_password(path(src.password_file), src.password_env, file, "password")
            except SecurityError as e:
                which = "password_file" if src.password_file else "password_env"
                raise ConfigError(file, f"{prefix}.{which}", str(e).split(": ", 2)[-1]) from None
        for name in ("ca_file", "cert_file", "key_file"):
            value = path(getattr(self, name))
            if value is not None and not Path(value).is_file():
                raise ConfigError(file, f"kafka.security.{name}", f"no such file: {value}")
        try:
            return ClientSecurity(protocol=self.protocol, mechanism=self.sasl_mechanism,
                                  username=src.username, password=password,
                                  ca_file=path(self.ca_file), cert_file=path(self.cert_file),
                                  key_file=path(self.key_file), check_hostname=self.check_hostname,
                                  source=f"kafka.security of {file}" + (f" (principal {k})" if p else ""))
        except SecurityError as e:
            raise ConfigError(file, "kafka.security", str(e)) from None


@dataclass(frozen=True)
class ClusterSecurityConfig:
    """How clients authenticate to one Kafka cluster other than the job's own (a region's existing
    cluster: topology ``regions.<r>.kafka_security``, and the ``rollout.weights_security`` its RaaS
    nodes get from it). The keys of ``kafka.security`` without principals; passwords are never
    inline: a file (first line) or an environment variable holds each."""

    protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"] = _f(
        "PLAINTEXT", "the cluster listener's security protocol (SASL_SSL: TLS + a SASL login)")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = _f(
        None, "SASL mechanism of the SASL_* protocols")
    username: str | None = _f(None, "the SASL user")
    password_file: str | None = _f(None, "a file holding its password (first line; relative to the file that "
                                         "names it)")
    password_env: str | None = _f(None, "an environment variable holding its password")
    ca_file: str | None = _f(None, "PEM file of the CA(s) that signed the brokers' certificates (SSL, SASL_SSL; "
                                   "null: the system's)")
    cert_file: str | None = _f(None, "PEM client certificate (mutual TLS; with key_file)")
    key_file: str | None = _f(None, "PEM private key of cert_file (unencrypted PKCS#8)")
    check_hostname: bool = _f(True, "check the broker certificate's name against the address dialled")

    def problem(self) -> tuple[str, str] | None:
        """The first inconsistency as ``(key, what is wrong)``, or None (files are read by :meth:`client`)."""
        sasl, tls = self.protocol.startswith("SASL_"), self.protocol.endswith("SSL")
        if sasl:
            if self.sasl_mechanism is None:
                return "sasl_mechanism", f"{self.protocol} needs one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"
            if not self.username:
                return "username", f"{self.protocol} needs a user"
            if bool(self.password_file) == bool(self.password_env):
                return "password_file", "give exactly one of password_file and password_env (the password is never inline)"
        else:
            for name in ("sasl_mechanism", "username", "password_file", "password_env"):
                if getattr(self, name) is not None:
                    return name, f"set, but protocol {self.protocol} has no SASL login; use SASL_SSL or drop it"
        if not tls:
            for name in ("ca_file", "cert_file", "key_file"):
                if getattr(self, name) is not None:
                    return name, f"set, but protocol {self.protocol} has no TLS; use SSL or SASL_SSL or drop it"
        if (self.cert_file is None) != (self.key_file is None):
            return "key_file" if self.cert_file else "cert_file", "a client certificate needs both cert_file and key_file"
        return None

    def absolute(self, base_dir: str | Path) -> "ClusterSecurityConfig":
        """The same setting with its relative paths taken from ``base_dir``."""
        def path(p: str | None) -> str | None:
            return None if p is None or Path(p).is_absolute() else str(Path(base_dir, p).resolve())
        return dataclasses.replace(self, **{k: path(getattr(self, k)) or getattr(self, k)
                                            for k in ("password_file", "ca_file", "cert_file", "key_file")})

    def overrides(self, prefix: str) -> list[str]:
        """``--set`` pairs carrying it to a process (no secret: only file and variable names)."""
        return [f"{prefix}.{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default]

    def client(self, file: str, key: str, base_dir: str | Path = ".", error: type = None):
        """The :class:`~astraflow.topics.security.ClientSecurity` it describes: the password read
        from its file or variable, relative paths from ``base_dir``; ``error`` (default
        :class:`ConfigError`) naming ``file`` and the key (under ``key``) that cannot be used."""
        from astraflow.topics.security import ClientSecurity, SecurityError, read_password
        error = error or ConfigError
        sec = self.absolute(base_dir)
        password = None
        if sec.protocol.startswith("SASL_"):
            try:
                password = read_password(sec.password_file, sec.password_env, file, "password")
            except SecurityError as e:
                which = "password_file" if sec.password_file else "password_env"
                raise error(file, f"{key}.{which}", str(e).split(": ", 2)[-1]) from None
        for name in ("ca_file", "cert_file", "key_file"):
            value = getattr(sec, name)
            if value is not None and not Path(value).is_file():
                raise error(file, f"{key}.{name}", f"no such file: {value}")
        try:
            return ClientSecurity(protocol=sec.protocol, mechanism=sec.sasl_mechanism, username=sec.username,
                                  password=password, ca_file=sec.ca_file, cert_file=sec.cert_file,
                                  key_file=sec.key_file, check_hostname=sec.check_hostname,
                                  source=f"{key} of {file}",
                                  password_env=sec.password_env if password is not None else None)
        except SecurityError as e:
            raise error(file, key, str(e).split(": ", 1)[-1]) from None


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str | None = _f(None, "existing cluster; null starts the embedded broker")
    task_partitions: int = _f(8, "partitions of tasks.<policy> (>= most RaaS nodes of a policy)",
                              bounds=Bounds(1, 10_000))
    trajectory_partitions: int = _f(4, "partitions of the trajectories topic", bounds=Bounds(1, 10_000))
    replication_factor: int | None = _f(None, "copies of each partition of the job's topics; null: min(3, brokers "
                                              "in the cluster when a topic is created)", bounds=Bounds(1, 100))
    min_insync_replicas: int | None = _f(None, "copies an acks=all write needs; null: replication_factor - 1 "
                                               "(at least 1), so losing one broker stops nothing",
                                               bounds=Bounds(1, 100))
    transaction_timeout_ms: int = _f(30_000, "a producer that dies inside a transaction blocks read_committed "
                                             "readers of its partitions until the broker aborts it after this "
                                             "long; at most the broker's transaction.max.timeout.ms (900000)",
                                             bounds=Bounds(1_000, 900_000, why="at most the broker's "
                                                           "transaction.max.timeout.ms, 900000 by default"))
    retention: RetentionConfig = _f(RetentionConfig(), "broker-side retention per topic family (ms / bytes), to "
                                                       "bound a run dir's Kafka log (docs/run-dir.md)")
    security: KafkaSecurityConfig = _f(KafkaSecurityConfig(), "authentication and TLS of every client "
                                                              "(docs/security.md)")

    def __post_init__(self) -> None:
        if self.bootstrap_servers is not None:
            from astraflow.topics.bootstrap import parse_bootstrap
            parse_bootstrap(self.bootstrap_servers, "kafka.bootstrap_servers")
            if self.security.embedded:
                raise ValueError("kafka.security.embedded: secures the broker a run starts itself, but "
                                 "kafka.bootstrap_servers names a cluster; give that cluster's protocol and "
                                 "principals in kafka.security instead")
        if self.replication_factor is not None and self.replication_factor < 1:
            raise ValueError(f"kafka.replication_factor must be >= 1, got {self.replication_factor}")
        if self.min_insync_replicas is not None and not (
                1 <= self.min_insync_replicas <= (self.replication_factor or self.min_insync_replicas)):
            raise ValueError(f"kafka.min_insync_replicas must be between 1 and kafka.replication_factor "
                             f"({self.replication_factor}), got {self.min_insync_replicas}")
        if not 1_000 <= self.transaction_timeout_ms <= 900_000:
            raise ValueError(f"kafka.transaction_timeout_ms must be between 1000 and the broker's "
                             f"transaction.max.timeout.ms (900000 by default), got {self.transaction_timeout_ms}")


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = _f(None, "HF model dir; null builds/uses the cached tiny bootstrapped model")
    seed: int = _f(0, "seed of the tiny-model bootstrap", bounds=SEED)
    task: str = _f("arithmetic", "what the tiny bootstrapped model is warm-started on (its role): arithmetic, "
                                 "verifier, code_solver, selector, test_generator, text_game, search, search_wide "
                                 "(`astraflow model init --list`)")
    max_positions: int | None = _f(None, "the tiny bootstrapped model's window in tokens (null: 128); another "
                                         "window is another cached build (`astraflow model init --max-positions N`); "
                                         "only with model.path null (a model directory declares its own)",
                                   bounds=Bounds(16, 32_768))


@dataclass(frozen=True)
class DataConfig:
    source: str = _f("arithmetic", "'arithmetic' (synthetic generator), 'code' (program synthesis with hidden "
                                   "tests), 'text_game' (the agent workflow's game tasks), 'search' (the search "
                                   "environment's questions) or a path to a JSONL/Parquet file of {prompt, answer}")
    max_digits: int = _f(2, "synthetic: operand digits", bounds=Bounds(1, 18))
    ops: str = _f("+-", "synthetic: operators")
    seed: int = _f(0, "synthetic: generator seed", bounds=SEED)
    num_prompts: int | None = _f(None, "prompts to load (null: enough for trainer.steps)", bounds=Bounds(1, 10**9))
    on_bad_row: Literal["fail", "skip"] = _f("fail", "a file row that is not JSON or lacks prompt/answer: 'fail' "
                                                     "stops the job naming file:line; 'skip' sends it to the "
                                                     "dlq topic (source file:<path>, offset = line) and goes on")


@dataclass(frozen=True)
class RolloutConfig:
    engine: EngineRolloutConfig = _f(EngineRolloutConfig(), "the rollout engine (engines/config.py: kind cpu|sglang, "
                                                             "threads, sglang server options); model from `model`")
    nodes: int = _f(1, "RaaS node processes `astraflow run` starts", bounds=Bounds(1, 1024))
    n_samples: int = _f(8, "samples per prompt (the GRPO group size)", bounds=Bounds(1, 4096))
    temperature: float = _f(1.0, "sampling temperature", bounds=Bounds(0, 100, lo_open=True))
    top_p: float = _f(1.0, "nucleus sampling mass", bounds=Bounds(0, 1, lo_open=True))
    top_k: int = _f(0, "top-k (0: off)", bounds=Bounds(0, 1_000_000))
    max_new_tokens: int = _f(8, "generation length limit", bounds=Bounds(1, 1_000_000))
    tasks_per_call: int = _f(4, "tasks a node polls and rolls out together", bounds=Bounds(1, 100_000))
    polls_in_flight: int = _f(1, "polls of tasks a node rolls out at once: above 1 the next poll starts while "
                                 "the last one's episodes wait (on another pool's role calls, on the engine), "
                                 "and polls commit in order; worth it on an engine that batches concurrent "
                                 "calls (SGLang, an emulated device) in a multi-policy job", bounds=Bounds(1, 16))
    batch_invariant: bool = _f(False, "true generates each task's samples in a call of their own, so a task's "
                                      "logprob bits (not only its seeds) never depend on which tasks share a poll "
                                      "and same-seed sync runs are byte-identical; costs ~2.5x the CPU engine's "
                                      "tokens/s (batched kernels change their reduction order with the row count)")
    heartbeat_s: float = _f(2.0, "heartbeat interval on the control topic", bounds=Bounds(0, 3_600, lo_open=True))
    max_episode_failures: int = _f(16, "a RaaS node stops the job (a fatal error, reported on the control topic) "
                                       "after this many episodes in a row failed with a deterministic error (the "
                                       "workflow or its reward raising ValueError, TypeError, KeyError, ... on its "
                                       "input) and none succeeded; transient errors (timeouts, Kafka, the engine) "
                                       "do not count. 0: never (failed episodes are recorded and replaced)",
                                   bounds=Bounds(0, 10**9))
    weights_bootstrap_servers: str | None = _f(None, "the Kafka cluster RaaS nodes read versions and weights.<policy> "
                                                     "from: their region's own cluster, where MirrorMaker 2 copies "
                                                     "them from the home cluster (`astraflow launch` sets it for a "
                                                     "region with its own cluster, docs/cross_region_mirror.md); "
                                                     "null: the cluster of everything else (--bootstrap-servers)")
    weights_security: ClusterSecurityConfig | None = _f(None, "how RaaS nodes authenticate to the "
                                                              "weights_bootstrap_servers cluster (set with it from the "
                                                              "region's kafka_security in the topology); null: "
                                                              "kafka.security, like every other client")
    prefetch_weights: bool = _f(False, "read weight chunks while the trainer writes them (one more consumer per "
                                       "node) instead of after the version is announced: for nodes on other "
                                       "machines than the trainer; on one shared machine it only moves CPU (see "
                                       "docs/weight-transfer.md, The weight path)")
    device: DeviceConfig = _f(DeviceConfig(), "the device each RaaS node stands for: cpu, or an emulated accelerator "
                                              "(emulation/profiles.yaml) that holds each engine call for its "
                                              "modelled time")
    signing_key: str | None = _f(None, "Ed25519 private key (PEM) this policy's RaaS nodes sign the trajectory "
                                       "groups of their episodes with (the pool's identity); a relative path is "
                                       "relative to the config file. null: `astraflow run` / `astraflow node` use "
                                       "<run dir>/keys/raas-<policy>.ed25519, created if absent (on several hosts, "
                                       "configure it: docs/security.md, Signed groups)")
    verify_key: str | None = _f(None, "public key (PEM) the dataflow and the audit check this pool's groups against; "
                                      "null: the public half of signing_key")
    require_signatures: bool = _f(True, "the dataflow counts only groups signed by verify_key (a forged or unsigned "
                                        "one is dead-lettered and never settles a task). false: unsigned ones count "
                                        "too; with no key configured either, nothing is checked")

    def __post_init__(self) -> None:
        if self.weights_bootstrap_servers is not None:
            from astraflow.topics.bootstrap import parse_bootstrap
            parse_bootstrap(self.weights_bootstrap_servers, "rollout.weights_bootstrap_servers")
        if self.weights_security is not None:
            if self.weights_bootstrap_servers is None:
                raise ValueError("weights_security: set, but weights_bootstrap_servers is not: the weights come "
                                 "from the job's cluster, whose setting is kafka.security")
            bad = self.weights_security.problem()
            if bad is not None:
                raise ValueError(f"weights_security.{bad[0]}: {bad[1]}")


@dataclass(frozen=True)
class DataflowConfig:
    groups_per_batch: int = _f(8, "trajectory groups (prompts) per training batch", bounds=Bounds(1, 100_000))
    max_staleness: int = _f(1, "a sample generated at version v trains at version <= v + max_staleness",
                            bounds=Bounds(0, 10_000))
    algorithms: tuple[AlgorithmSpec, ...] = _f((), "data algorithms, in order within each hook: a name or "
                                                   "{name: ..., <params>}; curators greso, filter_solved, curriculum, "
                                                   "mixing; filter dynamic_sampling; composers replay, edf, fifo "
                                                   "(their parameters: docs/data-algorithms.md)")
    force_after_skips: int = _f(64, "after this many consecutive prompts rejected by curators, the next one is "
                                    "scheduled anyway (the anti-stall rule; metric dataflow.algorithms.forced)",
                                    bounds=Bounds(1, 10**9))


@dataclass(frozen=True)
class TrainerConfig:
    steps: int = _f(20, "optimizer steps (= policy versions) to train", bounds=Bounds(1, 10**7))
    ranks: int = _f(1, "trainer processes (DeepSpeed data-parallel ranks) per host; the world is ranks x "
                       "`astraflow node --nnodes`. Above 1, the trainer node starts its ranks with torch's "
                       "launcher and a rank's death restarts the whole group; each rank uses engine.threads",
                       bounds=Bounds(1, 4096))
    checkpoint_every: int = _f(1, "checkpoint every K steps (with the consumed batch offset)", bounds=Bounds(1, 10**7))
    keep_checkpoints: int = _f(2, "complete checkpoints kept on disk (the newest is resumed from)",
                               bounds=Bounds(1, 10_000))
    snapshot_every: int = _f(10, "full weight snapshot every K versions (sparse deltas between)",
                             bounds=Bounds(1, 10**7))
    weight_transport: Literal["delta", "full"] = _f(
        "delta", "what each version publishes: delta (a sparse delta every version, plus a full snapshot every "
                 "snapshot_every) or full (a full snapshot every version and no deltas: the baseline for what deltas "
                 "save, e.g. across a WAN link)")
    export_every: int = _f(0, "also write a Hugging Face model directory (safetensors, config, tokenizer) every K "
                              "versions, into <run dir>/hf/<policy>/v<K>/ (0: only the final one, which every "
                              "run writes, named by <run dir>/hf/<policy>/final); rank 0, in publish_dtype",
                           bounds=Bounds(0, 10**7))
    publish_dtype: Literal["float32", "bfloat16", "float16"] = _f(
        "float32", "dtype of the published weights (what rollout engines load); bfloat16 is what GPU engines hold, "
                   "and far fewer bf16 elements change per step than fp32 ones, so deltas shrink")
    engine: EngineTrainerConfig = _f(EngineTrainerConfig(), "the DeepSpeed train engine (engines/config.py: lr, loss, "
                                                            "zero_stage, token_budget, threads, ...)")
    cpu_nice: int = _f(0, "niceness added to the trainer node's process once it is ready to train (0-19; 0: "
                          "unchanged), like `renice`. Where the trainer shares cores with the rollout nodes, "
                          "dataflow and broker, its next step waits on their path (generate, batch): a positive "
                          "value lets that path run first and the trainer take the cores' remaining time", bounds=NICE)
    device: DeviceConfig = _f(DeviceConfig(), "the device(s) the trainer stands for: cpu, or an emulated accelerator "
                                              "whose train steps are held for their modelled time on device.count "
                                              "devices (data parallel)")
    signing_key: str | None = _f(None, "Ed25519 private key (PEM; `openssl genpkey -algorithm ed25519`) the trainer "
                                       "signs this policy's version announcements with; a relative path is "
                                       "relative to the config file. null: `astraflow run` / `astraflow node` use "
                                       "<run dir>/keys/<policy>.ed25519, created if absent (fine on one host; "
                                       "on several, configure the key: docs/security.md, Signed weights)")
    verify_key: str | None = _f(None, "public key (PEM) the RaaS nodes, the evaluator and the dataflow check this "
                                      "policy's announcements against; null: the public half of signing_key")
    require_signatures: bool = _f(True, "readers count only announcements signed by verify_key (a forged or "
                                        "unsigned one is dead-lettered, the job goes on). false: unsigned "
                                        "ones count too (jobs written before signing, tests); with no key "
                                        "configured either, nothing is checked")

    def __post_init__(self) -> None:
        for key in ("steps", "ranks", "checkpoint_every", "snapshot_every", "keep_checkpoints"):
            if getattr(self, key) < 1:
                raise ValueError(f"trainer.{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.cpu_nice <= 19:
            raise ValueError(f"trainer.cpu_nice must be in 0..19 (a niceness increment), got {self.cpu_nice}")
        if self.export_every < 0:
            raise ValueError(f"trainer.export_every must be >= 0 (0: only the final export), got {self.export_every}")


@dataclass(frozen=True)
class EvalConfig:
    every: int = _f(5, "evaluate every E versions (0: only first and last)", bounds=Bounds(0, 10**7))
    problems: int = _f(200, "held-out problems evaluated (at most; a dataset file's held-out rows may be fewer)",
                       bounds=Bounds(1, 10**6))
    data: str | None = _f(None, "a JSONL/Parquet file of held-out rows ({prompt, answer, ...}, as data.source; "
                                "a relative path is relative to the config file). null: the held-out split of "
                                "the job's dataset (eval.holdout of a file; the generators' own held-out split). "
                                "Training rows with a prompt text of this file are left out of training")
    holdout: float | None = _f(None, "fraction of a dataset file's distinct prompts held out of training for "
                                     "evaluation (a seeded hash of the text, eval.split_seed). null: 0.1 when "
                                     "data.source is a file and eval.data is null, else 0",
                               bounds=Bounds(0, 1, hi_open=True))
    split_seed: int = _f(0, "seed of the held-out split of a dataset file (independent of the job seed, so "
                            "repetitions with other seeds measure the same rows)", bounds=SEED)
    k: int = _f(4, "samples per problem (pass@1 averaged over k)", bounds=Bounds(1, 4096))
    temperature: float = _f(0.6, "evaluation temperature", bounds=Bounds(0, 100))
    threads: int = _f(1, "torch threads of the evaluator", bounds=Bounds(0, 1024))
    device: DeviceConfig = _f(DeviceConfig(), "the device the evaluator stands for: cpu, or an emulated accelerator")
    cpu_nice: int = _f(10, "niceness added to the evaluator's threads (0-19; 0: unchanged), like `renice`: it only "
                           "measures, so where it shares cores with the dataflow, rollout nodes and trainer (the "
                           "dataflow node hosts it) it takes what they leave; a busy machine makes it evaluate "
                           "a later version of a target (the metric says which)", bounds=NICE)

    def __post_init__(self) -> None:
        if not 0 <= self.cpu_nice <= 19:
            raise ValueError(f"eval.cpu_nice must be in 0..19 (a niceness increment), got {self.cpu_nice}")


@dataclass(frozen=True)
class TracingConfig:
    otlp_endpoint: str | None = _f(None, "OTLP endpoint; null writes spans as JSONL in the run dir")
    otlp_protocol: Literal["http", "grpc"] = _f("http", "OTLP transport")


@dataclass(frozen=True)
class TrackingConfig:
    """Where the job's metrics go besides the run dir's ``metrics.jsonl`` (astraflow/tracking.py,
    docs/tracking.md). Off by default: ``metrics.jsonl`` already records every metric, and
    ``astraflow track`` writes the same files from the ``metrics`` topic after the fact."""

    tensorboard: bool = _f(False, "write TensorBoard event files of every metric to <run dir>/tensorboard "
                                  "(`tensorboard --logdir` on it)")
    mlflow: bool | str = _f(False, "log every metric to an MLflow run: true: a local file store, <run dir>/mlruns; "
                                   "a string: the tracking URI (a path or file:/path, sqlite:///path.db with the "
                                   "full mlflow package, http://host:5000 for a server)")
    experiment: str | None = _f(None, "the MLflow experiment the run goes to (created if missing; default: the job "
                                      "name)")
    run_name: str | None = _f(None, "the MLflow run's name (default: the run dir's name)")

    def __post_init__(self) -> None:
        if isinstance(self.mlflow, str) and not self.mlflow.strip():
            raise ValueError("tracking.mlflow must be true, false or a tracking URI, got an empty string")
        for key in ("experiment", "run_name"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise ValueError(f"tracking.{key} must be a non-empty name or null, got {value!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.tensorboard or self.mlflow)


@dataclass(frozen=True)
class SandboxConfig:
    allow_unisolated: bool = _f(False, "where the kernel gives no user/mount/network namespaces, run model-written "
                                       "code anyway, with rlimits, an audit hook and (as root) uid 65534 only: no "
                                       "filesystem or network isolation (docs/security.md, Sandbox). false: such code "
                                       "does not run and scores 0 with reason no_isolation")


@dataclass(frozen=True)
class AuditConfig:
    """The conservation audit `astraflow run` / `launch` run on the job's topics."""

    every_versions: int = _f(0, "also audit the running job every N trained versions (0: only once it has "
                                "finished); a violation no later record can repair stops the job",
                            bounds=Bounds(0, 10_000_000))
    settle_s: float = _f(30.0, "the audit at the end waits up to this long for work still in flight to settle "
                               "(a transaction a killed node left open) before its verdict", bounds=Bounds(0, 3600))

    def __post_init__(self) -> None:
        if self.every_versions < 0:
            raise ValueError(f"audit.every_versions must be >= 0 (0: only at the end), got {self.every_versions}")
        if not 0 <= self.settle_s <= 3600:
            raise ValueError(f"audit.settle_s must be in [0, 3600] seconds, got {self.settle_s}")


@dataclass(frozen=True)
class PolicyConfig:
    """One policy of a multi-policy job: its model, RaaS pool, batching and trainer. Each
    section starts from the job's top-level section of the same name (shared defaults)."""

    model: ModelConfig = _f(ModelConfig(), "the policy's initial model")
    rollout: RolloutConfig = _f(RolloutConfig(), "the policy's RaaS pool and sampling")
    dataflow: DataflowConfig = _f(DataflowConfig(), "the policy's batches: groups_per_batch, max_staleness, "
                                                    "algorithms")
    trainer: TrainerConfig = _f(TrainerConfig(), "the policy's trainer (engine.loss, lr, ...)")


@dataclass(frozen=True)
class WorkflowConfig:
    name: str = _f("rlvr", "registered workflow that turns a task into trajectories (rlvr, solver_verifier, "
                           "code_solver_selector, code_solver_testgen, or a user one: docs/workflows.md)")
    roles: dict[str, str] = _f({}, "role -> policy; empty: every role of the workflow is played by `policy`")
    params: dict[str, Any] = _f({}, "the workflow's own parameters (e.g. reward: exact_match | math_answer)")
    module: str | None = _f(None, "a Python module imported first, to register user workflows and rewards: a "
                                  "dotted name, looked up in the config file's directory first and then on "
                                  "PYTHONPATH, or a path to a .py file relative to that directory")


@dataclass(frozen=True)
class JobConfig:
    job: str = _f(help="job name; topics are af.<job>.*")
    mode: Literal["async", "sync"] = _f("async", "async overlaps rollout and training; sync alternates them")
    policy: str = _f("policy", "policy name")
    seed: int = _f(0, "job seed", bounds=SEED)
    run_dir: str = _f("runs", "where run directories are created")
    kafka: KafkaConfig = _f(KafkaConfig(), "Kafka")
    model: ModelConfig = _f(ModelConfig(), "model")
    data: DataConfig = _f(DataConfig(), "dataset")
    rollout: RolloutConfig = _f(RolloutConfig(), "RaaS nodes")
    dataflow: DataflowConfig = _f(DataflowConfig(), "dataflow")
    trainer: TrainerConfig = _f(TrainerConfig(), "trainer")
    eval: EvalConfig = _f(EvalConfig(), "evaluation")
    tracing: TracingConfig = _f(TracingConfig(), "tracing")
    tracking: TrackingConfig = _f(TrackingConfig(), "the metrics in TensorBoard and MLflow too (docs/tracking.md)")
    sandbox: SandboxConfig = _f(SandboxConfig(), "the sandbox model-written code runs in (workflows/sandbox.py)")
    audit: AuditConfig = _f(AuditConfig(), "the conservation audit of the job's topics (at the end, and every N "
                                           "versions)")
    policies: dict[str, PolicyConfig] = _f({}, "multi-policy jobs: name -> {model, rollout, dataflow, trainer}, "
                                               "each section merged over the top-level one; empty: one policy "
                                               "named `policy` made of the top-level sections")
    workflow: WorkflowConfig = _f(WorkflowConfig(), "the episode: a registered workflow and its role -> policy "
                                                    "binding")
    barrier: Literal["async", "lockstep"] = _f("async", "async: each policy trains as soon as its own batch is "
                                                        "full; lockstep: every policy steps together (the "
                                                        "trainer-centred schedule, for comparison)")
    source: str = field(default="<dict>", compare=False, metadata={"help": "file it was loaded from"})

    @classmethod
    def normalize_config(cls, data: dict, file: str) -> dict:
        """Before the keys are checked: each ``policies.<p>`` section starts from the top-level one."""
        return _with_policy_defaults(data, file)

    def __post_init__(self) -> None:
        # Names that become parts of Kafka topic names (af.<job>.tasks.<policy>, ...) and of
        # paths (<run_dir>/<job>-<time>, checkpoint and weight dirs per policy): refused here,
        # not by the broker or the file system once the components are already starting.
        for key, name in (("job", self.job), *((f"policies.{p}", p) for p in self.policies), ("policy", self.policy)):
            problem = check_name(name)
            if problem:
                raise ConfigError(self.source, key, problem)
        # Cross-section checks of the data algorithms (batch size, group size) at load time.
        from astraflow.algorithms.pipeline import PipelineError, build_pipeline, context_of
        try:
            build_pipeline(self.dataflow.algorithms, context_of(self), self.dataflow.force_after_skips)
        except PipelineError as e:
            raise ConfigError(self.source, f"dataflow.{e.key}", e.problem) from None
        self._check_workflow()
        self._check_eval()
        self._check_models()
        self._check_device_shares()
        self.kafka.security.check_policies(self.policy_names, self.source)

    def _check_eval(self) -> None:
        ev, files = self.eval, [s for s in self.data_sources if s not in GENERATORS]
        if ev.data is not None:
            if ev.data in GENERATORS or not ev.data.strip():
                raise ConfigError(self.source, "eval.data", f"expected a JSONL or Parquet file of held-out rows, got "
                                                            f"{ev.data!r} (the generators hold out a split of "
                                                            f"their own: leave eval.data null)")
            if ev.holdout:
                raise ConfigError(self.source, "eval.holdout", "set either eval.holdout (a split of the training "
                                                               "file) or eval.data (a held-out file), not both")
        elif ev.holdout is not None and not files:
            raise ConfigError(self.source, "eval.holdout", f"data.source {self.data.source!r} is a generator with a "
                                                           f"held-out split of its own; eval.holdout splits a "
                                                           f"dataset file (leave it null)")
        elif ev.holdout == 0 and files and len(files) == len(self.data_sources):  # no generator's split either
            raise ConfigError(self.source, "eval.holdout", "0 holds no rows out and eval.data is null: nothing "
                                                           "would be evaluated; set eval.holdout > 0 or eval.data")

    def _check_device_shares(self) -> None:
        """``device.share``: one policy's single pool node and its trainer, on the same count of
        the same profile's devices (emulation/share.py); the evaluator shares nothing."""
        if self.eval.device.share:
            raise ConfigError(self.source, "eval.device.share", "the evaluator runs on devices of its own")
        owners: dict[str, tuple[str, object, str]] = {}
        for p in self.policy_names:
            where = f"policies.{p}." if self.policies else ""
            sec = self.policies[p] if self.policies else self
            for stage, dev in (("rollout", sec.rollout.device), ("trainer", sec.trainer.device)):
                if not dev.share:
                    continue
                key = f"{where}{stage}.device.share"
                if stage == "rollout" and sec.rollout.nodes != 1:
                    raise ConfigError(self.source, key, f"{sec.rollout.nodes} RaaS nodes cannot take turns on one "
                                                        f"trainer's devices (rollout.nodes must be 1)")
                if dev.share in owners:
                    other, odev, _ = owners.pop(dev.share)
                    if other != p:
                        raise ConfigError(self.source, key, f"{dev.share!r} is policy {other!r}'s: a pool shares its "
                                                            f"devices with its own policy's trainer only")
                    if (odev.count, odev.profile) != (dev.count, dev.profile):
                        raise ConfigError(self.source, key, f"the pool and the trainer sharing {dev.share!r} must name "
                                                            f"the same devices (count and profile), got "
                                                            f"{odev.count} x {odev.profile} and {dev.count} x {dev.profile}")
                    owners[dev.share] = (p, None, key)  # taken by both
                else:
                    owners[dev.share] = (p, dev, key)
        for name, (_, dev, key) in owners.items():
            if dev is not None:
                raise ConfigError(self.source, key, f"{name!r} is named by this component only: a pool and its "
                                                    f"policy's trainer share devices, both naming them")

    def _check_models(self) -> None:
        """Each policy's tiny bootstrapped model is one that ``astraflow model init`` can build."""
        from astraflow.models.warm_start import WarmStartError, get_task
        for p in self.policy_names:
            where = f"policies.{p}.model" if self.policies else "model"
            model = self.policies[p].model if self.policies else self.model  # (a view would check itself again)
            if model.path:
                if model.max_positions is not None:
                    raise ConfigError(self.source, f"{where}.max_positions",
                                      f"sets the window of the tiny bootstrapped model, but {where}.path is set "
                                      f"({model.path}): its config.json declares its own positions (leave it null)")
                continue
            try:
                get_task(model.task)
            except WarmStartError as e:
                raise ConfigError(self.source, f"{where}.task", str(e)) from None

    @property
    def data_sources(self) -> tuple[str, ...]:
        """Every prompt source of the job: the mixing curator's sources, else ``data.source``."""
        for spec in self.dataflow.algorithms:
            if spec.name == "mixing":
                return tuple(spec.params.sources)
        return (self.data.source,)

    @property
    def heldout_fraction(self) -> float:
        """The fraction of each dataset file's distinct prompts held out (``eval.holdout``, or its default)."""
        if self.eval.holdout is not None:
            return self.eval.holdout
        return 0.1 if self.eval.data is None and any(s not in GENERATORS for s in self.data_sources) else 0.0

    @property
    def config_dir(self) -> str:
        """What relative data paths are relative to: the config file's folder."""
        return str(Path(self.source).parent) if self.source != "<dict>" else "."

    def _check_workflow(self) -> None:
        from astraflow.workflows.api import get_workflow
        if self.workflow.module:
            try:
                import_user_module(self.workflow.module, self.source)
            except Exception as e:  # noqa: BLE001 - the user's module: any error it raises is a config error
                raise ConfigError(self.source, "workflow.module",
                                  f"cannot import {self.workflow.module!r}: {type(e).__name__}: {e}") from None
        try:
            spec = get_workflow(self.workflow.name)
        except KeyError as e:
            raise ConfigError(self.source, "workflow.name", str(e.args[0])) from None
        if "reward" in self.workflow.params:  # the built-in workflows score with the reward it names
            from astraflow.workflows.api import get_reward
            try:
                get_reward(str(self.workflow.params["reward"]))
            except KeyError as e:
                raise ConfigError(self.source, "workflow.params.reward", str(e.args[0])) from None
        if spec.check is not None:
            from astraflow.workflows.api import WorkflowParamError
            try:
                spec.check(self.workflow.params)
            except WorkflowParamError as e:
                raise ConfigError(self.source, f"workflow.params.{e.key}", e.message) from None
        names = self.policy_names
        if self.policies and self.policy not in self.policies:
            raise ConfigError(self.source, "policy", f"{self.policy!r} is not one of policies ({', '.join(names)})")
        bound = self.role_policies
        for role in spec.roles:
            if role not in bound:
                raise ConfigError(self.source, f"workflow.roles.{role}",
                                  f"workflow {spec.name!r} calls role {role!r}: bind it to one of the policies "
                                  f"({', '.join(names)})")
        for role, policy in bound.items():
            if role not in spec.roles:
                raise ConfigError(self.source, f"workflow.roles.{role}",
                                  f"workflow {spec.name!r} has no role {role!r} (its roles: {', '.join(spec.roles)})")
            if policy not in names:
                raise ConfigError(self.source, f"workflow.roles.{role}",
                                  f"no policy {policy!r} (policies: {', '.join(names)})")
        if len(names) > 1:
            self._check_policy_algorithms(names)
        idle = [p for p in names if p not in bound.values()]
        if idle:
            raise ConfigError(self.source, f"policies.{idle[0]}", "no workflow role is bound to this policy: it "
                                                                  "would never get data (workflow.roles)")

    def _check_policy_algorithms(self, names) -> None:
        """Each policy's lane runs its own data algorithms (filters and composers on its own
        groups, checked against its own batch and group sizes). Prompt curators choose the
        prompts the team's episodes run on, once for every policy: the lead policy's run (they
        learn from its groups); a non-lead policy may repeat them (inherited from the top-level
        ``dataflow`` section; its lane skips them), never add or change one."""
        from astraflow.algorithms.pipeline import PipelineError, build_pipeline, context_for, is_curator
        lead = self.lead_policy
        lead_curators = [s for s in self.policies[lead].dataflow.algorithms if is_curator(s)]
        for p in names:
            section = self.policies[p]
            specs = section.dataflow.algorithms
            # the policy view's context, from its sections: a view is a JobConfig and would run
            # these checks again
            ctx = context_for(self.seed, section.dataflow, section.rollout,
                              0 if self.mode == "sync" else section.dataflow.max_staleness)
            try:
                build_pipeline(specs, ctx, section.dataflow.force_after_skips)
            except PipelineError as e:
                raise ConfigError(self.source, f"policies.{p}.dataflow.{e.key}", e.problem) from None
            if p == lead:
                continue
            for i, s in enumerate(specs):
                if is_curator(s) and s not in lead_curators:
                    raise ConfigError(self.source, f"policies.{p}.dataflow.algorithms[{i}]",
                                      f"{s.name} is a prompt curator: curators choose the prompts every policy's "
                                      f"episodes run on, once for the team, so they belong to the lead policy "
                                      f"{lead!r} (the one playing the workflow's first role; they learn from its "
                                      f"groups); {p!r} may run filters and composers of its own")

    # -- policies ----------------------------------------------------------------------
    @property
    def policy_names(self) -> tuple[str, ...]:
        """Every policy of the job; a single-policy job has one, named ``policy``."""
        return tuple(self.policies) if self.policies else (self.policy,)

    @property
    def role_policies(self) -> dict[str, str]:
        """Role -> policy: ``workflow.roles``, or every role of the workflow played by ``policy``."""
        if self.workflow.roles:
            return dict(self.workflow.roles)
        from astraflow.workflows.api import get_workflow
        return {role: self.policy for role in get_workflow(self.workflow.name).roles}

    @property
    def lead_policy(self) -> str:
        """The policy whose pool runs the episodes: the one playing the workflow's first role."""
        from astraflow.workflows.api import get_workflow
        return self.role_policies[get_workflow(self.workflow.name).roles[0]]

    def view(self, policy: str) -> "JobConfig":
        """This job as seen by one policy's components: ``policy``, ``model``, ``rollout``,
        ``dataflow`` and ``trainer`` are that policy's. A single-policy job is its own view."""
        if not self.policies:
            if policy != self.policy:
                raise KeyError(f"no policy {policy!r} (policies: {self.policy})")
            return self
        if policy not in self.policies:
            raise KeyError(f"no policy {policy!r} (policies: {', '.join(self.policies)})")
        p = self.policies[policy]
        return dataclasses.replace(self, policy=policy, model=p.model, rollout=p.rollout, dataflow=p.dataflow,
                                   trainer=p.trainer)

    @property
    def effective_staleness(self) -> int:
        """Sync mode is the zero-staleness schedule of the same components."""
        return 0 if self.mode == "sync" else self.dataflow.max_staleness


def import_user_module(module: str, source: str) -> None:
    """Import ``workflow.module``: a dotted name, found first in the directory of the config
    file ``source`` (then on ``sys.path``, as ``PYTHONPATH`` adds to it), or a ``.py`` file,
    relative to that directory. Every component loads the job config, so each imports it."""
    import hashlib
    import importlib
    import importlib.util
    import sys
    base = Path(source).parent if source != "<dict>" else Path.cwd()
    if module.endswith(".py"):
        path = (base / module).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"no file {path}")
        name = f"astraflow_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
        return
    top = module.split(".")[0]
    here = str(base.resolve())
    if ((base / f"{top}.py").is_file() or (base / top).is_dir()) and here not in sys.path:
        sys.path.insert(0, here)
    importlib.import_module(module)


_PRINCIPALS = ("kafka", "security", "principals")


def _override_path(dotted: str) -> list[str]:
    """A ``--set`` key's path of section names. Below ``kafka.security.principals`` an entry of
    a policy's node is itself dotted (``raas.solver``): ``...principals.raas.solver.username``
    sets ``principals["raas.solver"].username``."""
    parts = dotted.split(".")
    n = len(_PRINCIPALS)
    if tuple(parts[:n]) == _PRINCIPALS and len(parts) == n + 3 and parts[n] in POLICY_ROLES:
        return [*parts[:n], f"{parts[n]}.{parts[n + 1]}", parts[n + 2]]
    return parts


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> JobConfig:
    """Read and validate a YAML job config; ``overrides`` are dotted keys (``trainer.steps``)."""
    path = Path(path)
    data = load_yaml(path, "a mapping of sections")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, last = _override_path(dotted)
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(str(path), ".".join(parents[:i + 1]), f"is not a section, so {dotted} cannot be "
                                                                        "set (an override of a key inside it)")
        node[last] = value
    return from_dict(JobConfig, {**data, "source": str(path)}, str(path))


POLICY_SECTIONS = ("model", "rollout", "dataflow", "trainer")


def _merge(base: Any, over: Any) -> Any:
    """``over`` on top of ``base``, recursively for mappings."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base.get(k), v) if k in base else v for k, v in over.items()}}
    return over


def _with_policy_defaults(data: dict, file: str) -> dict:
    """Each ``policies.<p>`` section starts from the top-level section of the same name."""
    policies = data.get("policies")
    if not policies:
        return data
    if not isinstance(policies, dict):
        raise ConfigError(file, "policies", f"expected a mapping of policy name -> sections, got {policies!r}")
    merged = {}
    for name, own in policies.items():
        own = own or {}
        if not isinstance(own, dict):
            raise ConfigError(file, f"policies.{name}", f"expected a mapping of sections, got {own!r}")
        for key in own:
            if key not in POLICY_SECTIONS:
                raise ConfigError(file, f"policies.{name}.{key}",
                                  f"unknown key (allowed in policies.{name}: {', '.join(POLICY_SECTIONS)})")
        merged[str(name)] = {k: _merge(data.get(k, {}) or {}, own[k]) if k in own else (data.get(k, {}) or {})
                             for k in POLICY_SECTIONS}
    out = {**data, "policies": merged}
    out.setdefault("policy", next(iter(merged)))
    return out


def describe(cls: type = JobConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every key: the config reference `astraflow config keys` prints. A number's
    help ends with the range it is loaded within."""
    rows = []
    for f in dataclasses.fields(cls):
        if cls is JobConfig and f.name == "source":
            continue
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            rows += describe(hint, prefix + f.name + ".")
        else:
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = "(required)"
            bounds = f.metadata.get("bounds")
            rows.append((prefix + f.name, repr(default), f.metadata.get("help", "") + (f" ({bounds})" if bounds else "")))
    return rows


def install_security(cfg: JobConfig, role: str = "admin", policy: str | None = None):
    """Make ``kafka.security`` (as ``role``'s principal) the client setting of this process;
    a raas or trainer node serves ``policy`` (default ``cfg.policy``, a policy view's) and logs
    in as ``<role>.<policy>`` when configured, else as ``<role>``. A config without one leaves
    the environment's (``ASTRAFLOW_KAFKA_*``, else PLAINTEXT). Returns the setting now in
    force; :class:`ConfigError` when a password or TLS file named by the config cannot be read."""
    from astraflow.topics import security
    if cfg.kafka.security == KafkaSecurityConfig() or cfg.kafka.security.embedded:  # (the run makes the latter's)
        return security.current()
    policy = (policy or cfg.policy) if role in POLICY_ROLES else None
    return security.install(cfg.kafka.security.client(role, cfg.config_dir, cfg.source, policy=policy))
